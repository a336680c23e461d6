"""Accelerators and cluster nodes for the planner.

Peak numbers are dense bf16 matmul peaks (no sparsity) from the vendors' data sheets; bandwidths are
peak line rates, one direction, per GPU. The planner multiplies them by efficiency factors
(`Efficiency`), which are assumptions, stated in docs/PLANNER.md.

Sources (public data sheets):
* MI300X: 1307.4 TFLOP/s bf16, 192 GB HBM3 at 5.3 TB/s, Infinity Fabric 7 links, 896 GB/s aggregate
  (both directions) -> 448 GB/s per direction (AMD Instinct MI300X data sheet). No switch: the node's 8 GPUs
  are a full mesh, one 64 GB/s link to each other GPU, so a group of n of them uses n - 1 links.
* MI325X: same compute die as MI300X (1307 TFLOP/s), 256 GB HBM3E at 6.0 TB/s, same fabric
  (AMD Instinct MI325X data sheet).
* MI355X: 2.5 PFLOP/s dense bf16 (the MI350X, at a lower clock: 2.3), 288 GB HBM3E at 8.0 TB/s, Infinity Fabric 1075 GB/s aggregate
  (AMD Instinct MI355X data sheet).
* H100 SXM: 989 TFLOP/s dense bf16, 80 GB HBM3 at 3.35 TB/s, NVLink 4 900 GB/s aggregate.
* H200 SXM: 989 TFLOP/s dense bf16, 141 GB HBM3E at 4.8 TB/s, NVLink 4 900 GB/s aggregate.
* A100 SXM 80GB: 312 TFLOP/s dense bf16, 80 GB HBM2e at 2.04 TB/s, NVLink 3 600 GB/s aggregate.
* Scale-out: one 400 Gb/s NIC per GPU (50 GB/s) for the MI300X/MI325X/MI355X nodes (ZAYA1's cluster:
  8 AMD Pensando Pollara 400 per node, 3.2 Tb/s per node) and for H100/H200 nodes (ConnectX-7 400G);
  A100 nodes: one 200 Gb/s HDR NIC per GPU (25 GB/s).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

# Dense bf16 peak in TFLOP/s per device (the table MFU is computed against).
PEAK_BF16_TFLOPS: dict[str, float] = {
    "mi300x": 1307.0,
    "mi325x": 1307.0,
    "mi355x": 2516.6,       # 256 CUs x 2.4 GHz x 4096 bf16 FLOPs per clock (MI350X, 2.2 GHz: 2306.9)
    "h100": 989.0,
    "h200": 989.0,
    "a100": 312.0,
}


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    device: str
    gpus_per_node: int
    memory_gb: float              # HBM per GPU as the vendors write it, "192 GB": binary, GiB (2**30 bytes)
    peak_bf16_tflops: float       # dense bf16 matmul peak per GPU
    hbm_tbps: float               # HBM bandwidth per GPU, TB/s
    intra_node_gbps: float        # GPU-GPU fabric per GPU, one direction, GB/s
    inter_node_gbps: float        # scale-out network per GPU, one direction, GB/s
    # 0: a switch (NVSwitch), every group inside a node gets the whole fabric; k: k point-to-point links per
    # GPU, a full mesh (AMD's Infinity Fabric, 7 links of 64 GB/s), where a group of n GPUs uses n - 1 of them
    intra_node_links: int = 0

    def fabric_fraction(self, group_size: int) -> float:
        """The share of `intra_node_gbps` one GPU of a group of `group_size` GPUs inside a node can use."""
        if not self.intra_node_links:
            return 1.0
        return min(max(group_size - 1, 1), self.intra_node_links) / self.intra_node_links

    @property
    def memory_bytes(self) -> float:
        """Bytes of HBM: the vendors' "GB" of HBM are GiB (MI300X's 192 GB: 8 stacks of 24 GiB; the device
        reports 205.8e9 bytes; an H100's 80 GB reports 85.0e9), while the planner prints its estimates in
        GB of 1e9 bytes."""
        return self.memory_gb * 2 ** 30

    @property
    def peak_flops(self) -> float:
        return self.peak_bf16_tflops * 1e12


CLUSTERS: dict[str, ClusterSpec] = {
    "mi300x": ClusterSpec("mi300x", "AMD Instinct MI300X", 8, 192, PEAK_BF16_TFLOPS["mi300x"], 5.3, 448, 50, 7),
    "mi325x": ClusterSpec("mi325x", "AMD Instinct MI325X", 8, 256, PEAK_BF16_TFLOPS["mi325x"], 6.0, 448, 50, 7),
    "mi355x": ClusterSpec("mi355x", "AMD Instinct MI355X", 8, 288, PEAK_BF16_TFLOPS["mi355x"], 8.0, 537.5, 50, 7),
    "h100": ClusterSpec("h100", "NVIDIA H100 SXM", 8, 80, PEAK_BF16_TFLOPS["h100"], 3.35, 450, 50),
    "h200": ClusterSpec("h200", "NVIDIA H200 SXM", 8, 141, PEAK_BF16_TFLOPS["h200"], 4.8, 450, 50),
    "a100": ClusterSpec("a100", "NVIDIA A100 SXM 80GB", 8, 80, PEAK_BF16_TFLOPS["a100"], 2.04, 300, 25),
}


@dataclass(frozen=True)
class Efficiency:
    """Fractions of the peaks that the planner assumes are achieved (see docs/PLANNER.md)."""
    compute: float = 0.35         # achieved fraction of bf16 peak over the model's FLOPs (forward+backward)
    hbm: float = 0.7              # achieved fraction of HBM bandwidth for memory-bound work (optimizer step)
    intra_node: float = 0.7       # achieved bus bandwidth / fabric peak for collectives inside a node
    inter_node: float = 0.7       # achieved bus bandwidth / NIC line rate for collectives across nodes

    def validate(self) -> "Efficiency":
        flags = {"compute": "--compute-efficiency", "hbm": "--hbm-efficiency",
                 "intra_node": "--intra-node-efficiency", "inter_node": "--inter-node-efficiency"}
        for field, flag in flags.items():
            value = getattr(self, field)
            if not 0 < value <= 1:
                raise ValueError(f"{flag}={value}: must be in (0, 1]")
        return self


def cluster_from_preset(name: str, **overrides) -> ClusterSpec:
    """A cluster preset with some fields replaced (None values are ignored)."""
    key = name.lower()
    if key not in CLUSTERS:
        raise ValueError(f"--cluster={name}: unknown cluster; choose one of {sorted(CLUSTERS)}")
    changes = {k: v for k, v in overrides.items() if v is not None}
    spec = dataclasses.replace(CLUSTERS[key], **changes)
    for field, flag in (("gpus_per_node", "--gpus-per-node"), ("memory_gb", "--gpu-memory-gb"),
                        ("peak_bf16_tflops", "--peak-tflops"), ("hbm_tbps", "--hbm-tbps"),
                        ("intra_node_gbps", "--intra-node-gbps"), ("inter_node_gbps", "--inter-node-gbps")):
        if not 0 < getattr(spec, field) < math.inf:     # (NaN fails it too)
            raise ValueError(f"{flag}={getattr(spec, field)}: must be a positive finite number")
    return spec
