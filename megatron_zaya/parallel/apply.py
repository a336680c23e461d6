"""Turn a single-device ZayaModel (built with the same seed on every rank) into its parallel form
for a layout, in place, and back: `gather_full_state_dict` returns the single-device state dict.

What changes (parameter names never do):
  TP > 1   weights sliced (megatron_zaya.parallel.tensor), vocab-parallel embedding + loss
  EP > 1   experts sliced over EP, all-to-all dispatcher (megatron_zaya.parallel.expert)
  CP > 1   CCA on two sequence chunks with halo exchange and K/V all-gather (parallel.context)
  SP       sequence-parallel residual stream between the TP regions (needs TP > 1)
  always   expert parameters marked `is_expert` (reduced over expert-DP), and the routing counts in
           ModelOutput all-reduced over the ranks holding different tokens: they are GLOBAL (unless
           `model.local_routing_counts` is set: the trainer sums the local counts of a step's
           micro-batches and reduces them once, so no forward waits for the other ranks there).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from megatron_zaya.model.zaya import ZayaModel
from megatron_zaya.parallel.expert import ParallelMoE, apply_expert_parallel
from megatron_zaya.parallel.mappings import group_size
from megatron_zaya.parallel.state import check_layout
from megatron_zaya.parallel.tensor import ParallelCCA, apply_tensor_parallel


def sum_counts_over_token_ranks(counts: torch.Tensor, pstate) -> torch.Tensor:
    """All-reduce (in place) routing counts over the ranks that hold different tokens."""
    if group_size(pstate.token_group) > 1:
        dist.all_reduce(counts, group=pstate.token_group)
    return counts


def global_routing_counts(routing: list, pstate) -> None:
    """All-reduce every layer's Routing.counts (in place) over the ranks that hold different tokens:
    one collective for all layers. parallelize_model's forward hook already does this."""
    if not routing or group_size(pstate.token_group) == 1:
        return
    stacked = sum_counts_over_token_ranks(torch.stack([r.counts for r in routing]), pstate)
    for r, c in zip(routing, stacked):
        r.counts = c


def _reduce_counts_hook(model, args, kwargs, output):
    if not getattr(model, "local_routing_counts", False):
        global_routing_counts(output.routing, model.pstate)
    return output


def _check_inputs(model, args, kwargs):
    ps = model.pstate
    if ps.cp_size > 1 and kwargs.get("position_ids") is None and len(args) < 3:
        raise ValueError("under context parallelism pass position_ids (slice_batch_for_cp makes them)")
    tokens = args[0] if args else kwargs["tokens"]
    if ps.sequence_parallel and tokens.shape[1] % ps.tp_size:
        raise ValueError(f"sequence parallel: local sequence {tokens.shape[1]} must be divisible by "
                         f"--tensor-model-parallel-size={ps.tp_size}")


def parallelize_model(model: ZayaModel, pstate) -> ZayaModel:
    check_layout(pstate.world_size, pstate.tp_size, pstate.cp_size, pstate.ep_size, model.config)
    model.pstate = pstate
    for block in model.layers:
        for p in block.moe.experts.parameters():
            p.is_expert = True
    if pstate.tp_size > 1:
        apply_tensor_parallel(model, pstate)
    apply_expert_parallel(model, pstate)
    for block in model.layers:
        block.attention.__class__ = ParallelCCA
        block.attention.pstate = pstate
    model.register_forward_hook(_reduce_counts_hook, with_kwargs=True)
    model.register_forward_pre_hook(_check_inputs, with_kwargs=True)
    return model


def _gather_uneven(shard: torch.Tensor, group, dim: int, pieces_per_rank) -> torch.Tensor:
    """Undo one split: gather every rank's shard (sizes may differ) and place its pieces."""
    n = group_size(group)
    sizes = [sum(b - a for a, b in pieces) for pieces in pieces_per_rank]
    biggest = max(sizes)
    moved = shard.movedim(dim, 0).contiguous()
    padded = moved.new_zeros((biggest,) + moved.shape[1:])
    padded[:moved.shape[0]] = moved
    gathered = [torch.empty_like(padded) for _ in range(n)]
    dist.all_gather(gathered, padded, group=group)
    full_len = max(b for pieces in pieces_per_rank for a, b in pieces)
    full = moved.new_zeros((full_len,) + moved.shape[1:])
    for rank_shard, pieces in zip(gathered, pieces_per_rank):
        cursor = 0
        for a, b in pieces:
            full[a:b] = rank_shard[cursor:cursor + b - a]
            cursor += b - a
    return full.movedim(0, dim)


@torch.no_grad()
def gather_full_state_dict(model: ZayaModel, pstate) -> dict:
    """The single-device state dict (same keys and shapes), identical on every rank. Collective:
    every rank of the world must call it."""
    params = dict(model.named_parameters())
    state = {}
    for name, value in model.state_dict().items():
        p = params.get(name)
        full = value.detach()
        for kind, dim, pieces in reversed(getattr(p, "partitions", []) if p is not None else []):
            group = pstate.tp_group if kind == "tp" else pstate.ep_group
            full = _gather_uneven(full, group, dim, pieces)
        state[name] = full.clone()
    return state


def full_gradients(model: ZayaModel, pstate) -> dict:
    """Reduced gradients (main_grad or grad) gathered to full shape, for tests. Under ZeRO-1 a rank
    only holds its owned gradients: pass a model whose reducer is not sharded."""
    out = {}
    for name, p in model.named_parameters():
        g = getattr(p, "main_grad", None)
        g = p.grad if g is None else g
        g = torch.zeros_like(p) if g is None else g.detach()
        for kind, dim, pieces in reversed(getattr(p, "partitions", [])):
            g = _gather_uneven(g, pstate.tp_group if kind == "tp" else pstate.ep_group, dim, pieces)
        out[name] = g.clone()
    return out
