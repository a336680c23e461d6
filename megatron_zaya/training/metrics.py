"""Throughput, model FLOP/s and MFU, memory, and per-layer routing statistics.

MFU = achieved model FLOP/s per device / peak bf16 dense FLOP/s of the device. Model FLOPs come from
megatron_zaya.model.accounting (only the active expert counts; attention and CCA convolutions do;
training = 3x forward). Peaks: the table below for accelerators, a measured matmul peak on CPU (fp32's
when bf16 is asked for on a CPU without native bf16 matmuls: there fp32 is the faster of the two).
"""
from __future__ import annotations

import math
import resource
import time
from dataclasses import dataclass

import torch

from megatron_zaya.kernels.capability import bf16_matmul_is_native

# Dense bf16 peak TFLOP/s per device (vendor figures, no sparsity).
# The first key contained in the device name wins, so variants come before their family
# (H100 PCIe and H100 NVL run at lower clocks than the SXM part).
PEAK_TFLOPS_BF16 = {"MI355X": 2516.6, "MI350X": 2306.9, "MI325X": 1307.0, "MI300X": 1307.0, "MI250X": 383.0,
                    "H200NVL": 835.0, "H200": 989.0, "H100PCIE": 756.0, "H100NVL": 835.0, "H100": 989.0, "A100": 312.0}

# On ROCm, dense bf16 peak TFLOP/s per compute unit of an architecture (gcnArchName), times the device's compute
# units: ROCm shows each MI250X die and each partition of a partitioned MI300X as a device of its own (the
# table's figure is the whole module's), and some setups name an MI300X "AMD Radeon Graphics" or nothing.
# gfx942: MI300X / MI325X 1307.4 over 304 CUs (MI300A: 228 CUs, 980.6); gfx90a: MI250X 383 over 220 CUs.
PEAK_TFLOPS_BF16_PER_CU = {"gfx942": 1307.4 / 304, "gfx90a": 383.0 / 220}

_cpu_peak_cache: dict[torch.dtype, float] = {}


def measure_matmul_tflops(dtype: torch.dtype = torch.bfloat16, size: int = 1024, repeats: int = 5,
                          device: str = "cpu", time_budget_s: float = 1.0) -> float:
    """Best-of-`repeats` square matmul throughput in TFLOP/s on this device, at `size` or, on a
    device where one matmul of that size would take longer than `time_budget_s` (bf16 on an
    AVX2-only CPU: ~100 s at 2048), at the largest power-of-two size that fits the budget."""
    def seconds(a, b):
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device != "cpu":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    n = min(size, 128)
    while True:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        seconds(a, b)                                # warm-up (library and kernel set-up)
        once = seconds(a, b)                         # the cost of this size
        if n >= size or once * 8 > time_budget_s:    # the next size costs ~8x
            break
        n = min(size, 2 * n)
    best = min(seconds(a, b) for _ in range(repeats))
    return 2 * n ** 3 / best / 1e12


def table_peak_tflops(device_name: str) -> tuple[float, str] | None:
    """(peak, "table (KEY)") for an accelerator named like torch.cuda.get_device_name; None if unknown."""
    compact = device_name.upper().replace(" ", "")
    for key, peak in PEAK_TFLOPS_BF16.items():
        if key in compact:
            return peak, f"table ({key})"
    return None


def rated_peak_tflops(device: torch.device, name: str | None = None) -> tuple[float, str] | None:
    """(the vendor's dense bf16 peak of GPU `device`, where it came from): on ROCm by its architecture and compute
    units where PEAK_TFLOPS_BF16_PER_CU knows the architecture, else by its name (`name`, or
    torch.cuda.get_device_name's: table_peak_tflops); None when neither is known."""
    if torch.version.hip:
        properties = torch.cuda.get_device_properties(device)
        arch = getattr(properties, "gcnArchName", "").split(":")[0]
        if arch in PEAK_TFLOPS_BF16_PER_CU:
            units = properties.multi_processor_count
            return PEAK_TFLOPS_BF16_PER_CU[arch] * units, f"table ({arch}, {units} compute units)"
    return table_peak_tflops(torch.cuda.get_device_name(device) if name is None else name)


def device_peak_tflops(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> tuple[float, str]:
    """(peak TFLOP/s, where it came from)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        known = rated_peak_tflops(device, name)
        if known is not None:
            return known
        return measure_matmul_tflops(dtype, 8192, device="cuda"), f"measured matmul ({name})"
    note = ""
    if dtype == torch.bfloat16 and not bf16_matmul_is_native(device):
        # bf16 is emulated here at a small fraction of fp32's rate: the device's real peak is fp32's.
        dtype, note = torch.float32, ", bf16 not native"
    if dtype not in _cpu_peak_cache:
        _cpu_peak_cache[dtype] = measure_matmul_tflops(dtype)
    return _cpu_peak_cache[dtype], f"measured CPU {str(dtype).removeprefix('torch.')} matmul{note}"


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux reports KiB


def megatron_memory_scalars(device: torch.device) -> dict[str, float]:
    """Megatron-LM's memory tags: on a GPU torch's allocator statistics; on CPU the process's peak resident
    set as the maximum (the allocator's other figures have no CPU counterpart)."""
    if device.type != "cuda":
        return {"mem-max-allocated-bytes": float(peak_memory_bytes(device))}
    stats = torch.cuda.memory_stats(device)
    return {"mem-reserved-bytes": float(stats["reserved_bytes.all.current"]),
            "mem-allocated-bytes": float(stats["allocated_bytes.all.current"]),
            "mem-max-allocated-bytes": float(stats["allocated_bytes.all.peak"]),
            "mem-allocated-count": float(stats["allocation.all.current"])}


def routing_statistics(counts: torch.Tensor) -> dict[str, float]:
    """counts (E + 1,) tokens per class with the skip class last -> load statistics over the experts."""
    experts = counts[:-1].double()
    total_routed = experts.sum().clamp_min(1.0)
    shares = experts / total_routed
    nonzero = shares[shares > 0]
    entropy = -(nonzero * nonzero.log()).sum().item()
    mean = experts.mean().item()
    return {
        "tokens_per_expert_min": experts.min().item(),
        "tokens_per_expert_max": experts.max().item(),
        "tokens_per_expert_cv": (experts.std(unbiased=False).item() / mean) if mean > 0 else 0.0,
        "routing_entropy": entropy / math.log(len(experts)) if len(experts) > 1 else 1.0,
        "skip_rate": counts[-1].item() / max(1, counts.sum().item()),
    }


@dataclass
class IntervalMeter:
    """Sums over the iterations since the last console line, which reports their averages (as
    Megatron-LM does): loss over the steps that were not skipped, time and tokens over all of them."""
    iterations: int = 0
    loss_sum: float = 0.0
    loss_steps: int = 0
    seconds: float = 0.0
    tokens: int = 0
    nan_losses: int = 0         # skipped steps whose loss itself was not finite (Megatron-LM's nan iterations)

    def add(self, loss: float, seconds: float, tokens: int, skipped: bool) -> None:
        self.iterations += 1
        self.seconds += seconds
        self.tokens += tokens
        if not skipped:
            self.loss_sum += loss
            self.loss_steps += 1
        elif not math.isfinite(loss):
            self.nan_losses += 1

    @property
    def skipped(self) -> int:
        """Iterations skipped for a non-finite loss or gradient (their loss is not in the mean)."""
        return self.iterations - self.loss_steps

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.loss_steps if self.loss_steps else float("nan")

    @property
    def seconds_per_iteration(self) -> float:
        return self.seconds / max(1, self.iterations)

    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a host clock measures it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def empty_unused_memory(device: torch.device, level: int, at_least: int) -> None:
    """Megatron-LM's --empty-unused-memory-level: hand the caching allocator's unused GPU blocks
    back (torch.cuda.empty_cache) when `level` >= `at_least`: 1 after forward+backward, 2 also after
    the optimizer step. Fights fragmentation at the cost of new allocations; no-op on CPU."""
    if level >= at_least and device.type == "cuda":
        torch.cuda.empty_cache()
