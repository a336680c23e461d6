"""Per-GPU memory of a training layout: weights, gradients, optimizer shards, activations.

Mixed precision as pretrain_zaya.py --bf16 keeps it (Megatron's, with its distributed optimizer for ZeRO-1):
* under ZeRO-1 (--use-distributed-optimizer) model weights in bf16 (2 bytes), except the router's, kept in
  fp32 (4 bytes): the router runs in fp32 with autocast off (model/router.py), so its weights must be fp32
  for the model to run (`ParamInfo.storage_bytes`, the bf16 convention);
* without ZeRO-1 every weight in fp32 (4 bytes), its own master (no copy), and bf16 autocast casts the
  weights each micro-batch's forward multiplies: the copies it keeps for the backward
  (`weight_copy_bytes`) are memory that ZeRO-1's bf16 weights do not need (`StateMemory.autocast_copies`);
* gradients accumulate in an fp32 "main grad" buffer (4 bytes per parameter, --grad-dtype fp32, the
  default: accumulating over micro-batches in bf16 loses precision), or, as a what-if, in the bf16
  convention's dtype (--grad-dtype bf16). ZeRO-1 keeps the whole gradient buffer on every rank (it
  reduce-scatters in place);
* fp32 master weights (4 bytes) for the bf16 weights only; fp32 weights are their own master;
* AdamW: two fp32 moments (8 bytes) and one fp32 step counter per master tensor;
  Muon: one fp32 momentum buffer (4 bytes) for the hidden matrices (attention and router linear
  weights, every expert matrix), AdamW for the rest (embedding, conv kernels, vectors);
* ZeRO-1 (--use-distributed-optimizer) shards master weights and optimizer state: each group of
  parameters (dense bf16, dense fp32, expert) is laid out flat in model order, cut into equal
  contiguous shards of ceil(N / ranks) elements over its data-parallel group (dense: DP x CP;
  experts: DP x CP / EP), and each rank keeps one master/state tensor per parameter piece in its shard;
  Muon's matrices are not cut: each has one owner in its group, which keeps its momentum and master
  (`muon_owner_loads`), so at many ranks the largest owner holds far more than 1/N of them.

Parameter placement: TP shards the attention (all its tensors; with TP > KV heads each rank holds one
whole KV head, `tp_rank_config`) and the embedding; experts are split
over EP (E / EP experts per rank) and, when TP > 1, over TP too (expert tensor parallelism = TP);
the router, norms and residual scales are replicated.
"""
from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass, field

import torch

from megatron_zaya.config import ModelConfig
from megatron_zaya.planner.layout import ParallelLayout, tp_rank_config

OPTIMIZERS = ("adamw", "muon")
GRAD_DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class ParamInfo:
    name: str
    numel: int                 # elements on one rank (after TP / EP sharding)
    storage_bytes: int         # 2 (bf16) or 4 (fp32 router)
    expert: bool
    muon: bool                 # a hidden matrix Muon would update
    whole: int = 0             # elements with the TP split undone (what DistributedMuon balances owners by)
    cast: bool = False         # fp32 under bf16 autocast, the forward keeps a bf16 copy for the backward


def _kind(name: str) -> str:
    if ".moe.experts." in name:
        return "expert"
    if ".moe.router." in name:
        return "router"
    if name.startswith("embedding.") or name.startswith("output_layer."):
        return "embedding"
    if ".attention." in name:
        return "attention"
    return "vector"


_SHAPES: dict[tuple, list[tuple[str, tuple[int, ...]]]] = {}


def parameter_shapes(config: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter of the real module, built once per config on the meta device."""
    key = tuple(sorted(config.to_dict().items()))
    if key not in _SHAPES:
        from megatron_zaya.model import ZayaModel

        with torch.device("meta"):
            model = ZayaModel(config)
        _SHAPES[key] = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    return _SHAPES[key]


# CCA's four input projections: one matmul on their stacked weight, a bf16 tensor whichever the weights'
# dtype (counted among the activations: activations.projection_weight_bytes), so no copy of their own.
STACKED_PROJECTIONS = (".linear_q.", ".linear_k.", ".linear_v_current.", ".linear_v_previous.")


def kept_as_bf16_copy(name: str, shape: tuple[int, ...], kind: str, config: ModelConfig) -> bool:
    """Whether, stored in fp32 under bf16 autocast, the forward keeps a bf16 copy of this weight for its
    backward: the matmul and convolution weights (experts, output projection, convolutions, the LM head's:
    the tied embedding or the output layer), not the router's (fp32, autocast off), the vectors, nor the
    stacked input projections (STACKED_PROJECTIONS). As measured on the model's saved tensors."""
    if len(shape) < 2 or kind == "router" or any(part in name for part in STACKED_PROJECTIONS):
        return False
    return not (name.startswith("embedding.") and config.untie_embeddings_and_output_weights)


def parameter_inventory(config: ModelConfig, tp: int = 1, ep: int = 1) -> list[ParamInfo]:
    """Every parameter tensor one rank holds, in model order (the real module's, see parameter_shapes)."""
    params = []
    for name, shape in parameter_shapes(config):
        kind = _kind(name)
        whole = math.prod(shape) // (ep if kind == "expert" else 1)
        numel = -(-whole // tp) if kind in ("attention", "embedding", "expert") else whole
        muon = len(shape) >= 2 and kind not in ("embedding",) and ".conv_" not in name
        params.append(ParamInfo(name, numel, 4 if kind == "router" else 2, kind == "expert", muon, whole,
                                kept_as_bf16_copy(name, shape, kind, config)))
    return params


def optimizer_bytes_per_element(param: ParamInfo, optimizer: str) -> int:
    master = 4 if param.storage_bytes == 2 else 0
    if optimizer == "muon" and param.muon:
        return master + 4
    return master + 8


def optimizer_tensor_overhead(param: ParamInfo, optimizer: str) -> int:
    """Bytes per master tensor independent of its size: AdamW's fp32 step counter."""
    return 0 if (optimizer == "muon" and param.muon) else 4


def zero1_optimizer_bytes_per_rank(params: list[ParamInfo], ranks: int, optimizer: str) -> list[int]:
    """Master + optimizer-state bytes on each of `ranks` ranks for one flat buffer of `params`."""
    starts, total = [], 0
    for p in params:
        starts.append(total)
        total += p.numel
    shard = -(-total // ranks) if total else 0
    out = []
    for r in range(ranks):
        lo, hi = r * shard, min((r + 1) * shard, total)
        nbytes = 0
        if hi > lo:
            i = bisect.bisect_right(starts, lo) - 1
            while i < len(params) and starts[i] < hi:
                a, b = max(lo, starts[i]), min(hi, starts[i] + params[i].numel)
                if b > a:
                    nbytes += (b - a) * optimizer_bytes_per_element(params[i], optimizer)
                    nbytes += optimizer_tensor_overhead(params[i], optimizer)
                i += 1
        out.append(nbytes)
    return out


def zero1_buffers(params: list[ParamInfo]) -> dict[str, list[ParamInfo]]:
    """The flat buffers ZeRO-1 shards separately: dense bf16, dense fp32, experts."""
    buffers = {"dense_bf16": [], "dense_fp32": [], "expert": []}
    for p in params:
        key = "expert" if p.expert else ("dense_fp32" if p.storage_bytes == 4 else "dense_bf16")
        buffers[key].append(p)
    return buffers


def muon_owner_loads(params: list[ParamInfo], layout: ParallelLayout, load) -> list[float]:
    """Under ZeRO-1, DistributedMuon's whole-matrix owners: per rank of the dense (DP x CP) group, the sum of
    load(param) over the Muon matrices it owns, dense ones in its group and expert ones in its expert-DP group
    (rank r holds expert share r mod expert-DP, as the flat shards). Owners as the trainer picks them
    (parallel.data.owners_of_bucket: largest whole matrix first, to the least-loaded rank)."""
    from megatron_zaya.parallel.data import owners_of_bucket

    n = layout.dense_shard_group
    total = [0.0] * n
    for expert, ranks in ((False, n), (True, layout.expert_data_parallel)):
        matrices = [p for p in params if p.muon and p.expert == expert]
        owned = [0.0] * ranks
        for p, owner in zip(matrices, owners_of_bucket([p.whole for p in matrices], ranks)):
            owned[owner] += load(p)
        total = [t + owned[r % ranks] for r, t in enumerate(total)]
    return total


def _block(param: ParamInfo) -> str | None:
    """'layers.3' for a block's parameter, None outside the blocks."""
    return ".".join(param.name.split(".")[:2]) if param.name.startswith("layers.") else None


def weight_copy_bytes(params: list[ParamInfo], layout: ParallelLayout) -> int:
    """Without ZeRO-1 (fp32 weights): the bf16 copies of the weights (`ParamInfo.cast`) one micro-batch's
    forward keeps for its backward, at the backward's start. A recomputed unit keeps none in the forward and
    casts again when it reruns: under full recomputation the head's copy and the largest block's (the block
    being recomputed), with the moe module the experts' copies of one block only. Under ZeRO-1 the weights are
    bf16 and the matmuls use them as they are: 0."""
    if layout.zero1:
        return 0
    cast = [p for p in params if p.cast]
    if layout.recompute == "full":
        recomputed = [p for p in cast if _block(p) is not None]
    elif layout.recomputes_moe:
        recomputed = [p for p in cast if p.expert]
    else:
        recomputed = []
    per_block: dict[str | None, int] = {}
    for p in recomputed:
        per_block[_block(p)] = per_block.get(_block(p), 0) + p.numel
    kept = sum(p.numel for p in cast) - sum(per_block.values()) + max(per_block.values(), default=0)
    return 2 * kept


def autocast_copy_bytes(config: ModelConfig, params: list[ParamInfo], layout: ParallelLayout) -> int:
    """What fp32 weights (no ZeRO-1) add to one micro-batch's saved tensors under bf16 autocast, against the
    bf16 weights the activations are counted with: the bf16 weight copies (weight_copy_bytes), and the
    input scaling's saved embedding output in fp32 instead of bf16 (2 more bytes per token and hidden unit,
    split over TP under sequence parallelism). 0 under ZeRO-1."""
    if layout.zero1:
        return 0
    split = layout.tensor_parallel if layout.sequence_parallel else 1
    return weight_copy_bytes(params, layout) + 2 * config.hidden_size * layout.local_tokens // split


@dataclass
class StateMemory:
    weights: int
    gradients: int
    optimizer: int                  # master weights + optimizer state, this rank (the largest shard)
    optimizer_per_rank: list[int] = field(default_factory=list)
    parameters: int = 0             # elements held by one rank
    autocast_copies: int = 0        # without ZeRO-1: what fp32 weights add to the saved tensors (autocast_copy_bytes)

    @property
    def total(self) -> int:
        """Weights, gradients, masters and optimizer state (not the forward's `autocast_copies`)."""
        return self.weights + self.gradients + self.optimizer


def state_memory(config: ModelConfig, layout: ParallelLayout, optimizer: str = "adamw",
                 grad_dtype: str = "fp32") -> StateMemory:
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"--optimizer={optimizer}: choose one of {OPTIMIZERS}")
    if grad_dtype not in GRAD_DTYPES:
        raise ValueError(f"--grad-dtype={grad_dtype}: choose one of {GRAD_DTYPES}")
    params = parameter_inventory(tp_rank_config(config, layout.tensor_parallel), layout.tensor_parallel,
                                 layout.expert_parallel)
    gradients = sum(p.numel * (4 if grad_dtype == "fp32" else p.storage_bytes) for p in params)
    if not layout.zero1:       # fp32 weights, their own masters (the trainer casts only under ZeRO-1)
        params = [dataclasses.replace(p, storage_bytes=4) for p in params]
    weights = sum(p.numel * p.storage_bytes for p in params)
    if layout.zero1:
        # AdamW's state in flat element shards; with Muon, its matrices whole on their owners.
        by_muon = optimizer == "muon"
        per_rank = [0] * layout.dense_shard_group
        for key, group in zero1_buffers([p for p in params if not (by_muon and p.muon)]).items():
            ranks = layout.expert_data_parallel if key == "expert" else layout.dense_shard_group
            shards = zero1_optimizer_bytes_per_rank(group, ranks, optimizer)
            # Rank r of the dense group holds expert shard r mod (expert DP group size).
            per_rank = [total + shards[r % ranks] for r, total in enumerate(per_rank)]
        if by_muon:
            owned = muon_owner_loads(params, layout, lambda p: p.numel * optimizer_bytes_per_element(p, "muon"))
            per_rank = [total + int(b) for total, b in zip(per_rank, owned)]
        optimizer_bytes = max(per_rank)
    else:
        optimizer_bytes = sum(p.numel * optimizer_bytes_per_element(p, optimizer) + optimizer_tensor_overhead(p, optimizer)
                              for p in params)
        per_rank = [optimizer_bytes]
    return StateMemory(weights, gradients, optimizer_bytes, per_rank, sum(p.numel for p in params),
                       autocast_copy_bytes(config, params, layout))
