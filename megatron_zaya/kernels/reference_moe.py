"""Readable PyTorch references of the MoE path between the router and the grouped expert matmul: tokens
per expert, permute into expert order and unpermute back weighted by the gate (re-exported by reference.py,
the single source of truth the Triton kernels match)."""
from __future__ import annotations

import torch


def class_counts(index: torch.Tensor, num_classes: int) -> torch.Tensor:
    """How many entries of `index` (int64, values in [0, num_classes)) hold each class: bincount without its
    two device syncs on a GPU (it reads the index's min and max back to size its output). Deterministic: a
    1-D scatter_add_ is under torch.use_deterministic_algorithms."""
    ones = torch.ones_like(index, dtype=torch.int64)
    return torch.zeros(num_classes, dtype=torch.int64, device=index.device).scatter_add_(0, index, ones)


def expert_order(expert_index: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(order: the token index of each permuted row, in expert order, skipped tokens left out; counts: tokens
    per expert, shape (num_experts,)), for an expert_index (N,) in [0, num_experts] where num_experts means
    "no expert" (skip). Stable, so tokens keep their order within an expert. The permute of every backend."""
    order = torch.argsort(expert_index, stable=True)
    counts = class_counts(expert_index, num_experts + 1)[:num_experts]
    kept = int(counts.sum())   # the output's row count (a host value; a device sync on accelerators)
    return order[:kept], counts


def moe_permute(
    x: torch.Tensor, expert_index: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort tokens by expert: (the rows of x (N, D) that go to a real expert, in expert order; order; counts),
    order and counts as expert_order gives them."""
    order, counts = expert_order(expert_index, num_experts)
    return GatherRows.apply(x, order), order, counts


def moe_unpermute(
    expert_out: torch.Tensor, order: torch.Tensor, gate: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """Scatter expert outputs back to token order, weighted by each token's gate.

    expert_out: (K, D) in permuted order; order: (K,) token index of each row; gate: (N,) per token.
    Tokens that no row names (skipped tokens) get zeros."""
    weighted = expert_out * gate.index_select(0, order).unsqueeze(-1).to(expert_out.dtype)
    # = zeros(num_tokens, D).index_add(0, order, weighted): top-1 routing names each token at most
    # once, so the scatter is a gather by the inverse map (and its backward a gather by `order`).
    return GatherRows.apply(weighted, inverse_rows(order, num_tokens), order)


def inverse_rows(order: torch.Tensor, num_rows: int) -> torch.Tensor:
    """inv[t] = the position of t in `order` (an injective index into [0, num_rows)), or
    len(order) for t not in it (a row of zeros in GatherRows)."""
    inv = torch.full((num_rows,), order.shape[0], dtype=torch.int64, device=order.device)
    inv[order] = torch.arange(order.shape[0], dtype=torch.int64, device=order.device)
    return inv


def _gather_padded(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """src[index], where index == len(src) (possible only when index is longer than src: an
    inverse map of a partial order) selects a row of zeros."""
    if index.shape[0] > src.shape[0]:
        src = torch.cat((src, src.new_zeros(1, *src.shape[1:])))
    return src.index_select(0, index)


class GatherRows(torch.autograd.Function):
    """out = src[index] for an injective row index (index may name a zero row, see inverse_rows).
    The backward gathers too, by the inverse index, instead of index_select's scatter-add (a
    zero-filled buffer plus an atomic-free but serial scatter on CPU)."""

    @staticmethod
    def forward(ctx, src, index, inverse=None):
        ctx.save_for_backward(index if inverse is None else inverse)
        ctx.inverse_given, ctx.num_src = inverse is not None, src.shape[0]
        return _gather_padded(src, index)

    @staticmethod
    def backward(ctx, grad):
        (saved,) = ctx.saved_tensors
        back = saved if ctx.inverse_given else inverse_rows(saved, ctx.num_src)
        return _gather_padded(grad.contiguous(), back), None, None
