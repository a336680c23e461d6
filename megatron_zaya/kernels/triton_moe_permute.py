"""MoE permute / unpermute between the router and the grouped expert matmul (Triton).

The routing bookkeeping (a stable argsort of the expert index, the per-expert counts, and the
inverse map token -> permuted row, -1 for skipped tokens) is a handful of small int ops left to
torch. The (tokens x D) traffic runs in two row kernels:

* `_gather_rows`: out[r] = src[idx[r]] * scale[r] (or 0 when idx[r] < 0). It is the permute
  forward (idx = order), the permute backward (idx = inverse map, zero rows for skipped tokens),
  and the unpermute forward (idx = inverse map, scale = gate). Every output row is written
  exactly once, so no zero-fill pass and no atomics are needed.
* `_unpermute_bwd`: for permuted row i with token t = order[i]:
  d_expert_out[i] = g[t] * gate[t]  and  d_gate[t] = sum_d g[t, d] * expert_out[i, d].

Top-1 routing (the ZAYA1 router) makes `order` a permutation of the kept tokens; the Triton
unpermute relies on that (each token named by at most one row).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from megatron_zaya.kernels import reference
from megatron_zaya.kernels._triton_common import PRUNE, configs, rows_2d

_CONFIGS = configs(
    [triton.Config({"BLOCK_D": b}, num_warps=w) for b, w in ((256, 2), (512, 4), (1024, 4), (2048, 8))],
    triton.Config({"BLOCK_D": 32}, num_warps=1),
)


@triton.autotune(configs=_CONFIGS, key=["D", "HAS_SCALE"], prune_configs_by=PRUNE)
@triton.jit
def _gather_rows(src_ptr, idx_ptr, scale_ptr, out_ptr, D, stride_src, stride_out,
                 HAS_SCALE: tl.constexpr, BLOCK_D: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    src_row = tl.load(idx_ptr + r).to(tl.int64)
    valid = src_row >= 0
    safe_row = tl.where(valid, src_row, 0)
    load_limit = tl.where(valid, D, 0)  # skipped rows load nothing and store zeros
    scale = 1.0
    if HAS_SCALE:
        scale = tl.load(scale_ptr + r).to(tl.float32)
    for start in range(0, D, BLOCK_D):
        cols = start + tl.arange(0, BLOCK_D)
        mask = cols < D
        v = tl.load(src_ptr + safe_row * stride_src + cols, mask=cols < load_limit, other=0.0).to(tl.float32)
        tl.store(out_ptr + r * stride_out + cols, (v * scale).to(out_ptr.dtype.element_ty), mask=mask)


@triton.autotune(configs=_CONFIGS, key=["D"], prune_configs_by=PRUNE)
@triton.jit
def _unpermute_bwd(g_ptr, eo_ptr, order_ptr, gate_ptr, deo_ptr, dgate_ptr, D,
                   stride_g, stride_eo, stride_deo, BLOCK_D: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    t = tl.load(order_ptr + i).to(tl.int64)
    gate = tl.load(gate_ptr + t).to(tl.float32)
    acc = tl.zeros((BLOCK_D,), tl.float32)
    for start in range(0, D, BLOCK_D):
        cols = start + tl.arange(0, BLOCK_D)
        mask = cols < D
        g = tl.load(g_ptr + t * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
        eo = tl.load(eo_ptr + i * stride_eo + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(deo_ptr + i * stride_deo + cols, (g * gate).to(deo_ptr.dtype.element_ty), mask=mask)
        acc += g * eo
    tl.store(dgate_ptr + i, tl.sum(acc, axis=0))


def gather_rows(src: torch.Tensor, idx: torch.Tensor, scale: torch.Tensor | None = None, out_dtype=None) -> torch.Tensor:
    """out[r] = src[idx[r]] * scale[r]; rows with idx[r] < 0 are zero. src: (M, D), idx: (R,)."""
    src = rows_2d(src)
    d = src.shape[-1]
    out = torch.empty((idx.shape[0], d), dtype=out_dtype or src.dtype, device=src.device)
    if idx.shape[0] and d:
        _gather_rows[(idx.shape[0],)](
            src, idx.contiguous(), scale.contiguous() if scale is not None else idx, out,
            d, src.stride(0), out.stride(0), HAS_SCALE=scale is not None,
        )
    return out


def inverse_order(order: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """inv[t] = the permuted row of token t, -1 for tokens no row names."""
    inv = torch.full((num_tokens,), -1, dtype=torch.int64, device=order.device)
    inv[order] = torch.arange(order.shape[0], dtype=torch.int64, device=order.device)
    return inv


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, order):
        ctx.save_for_backward(order)
        ctx.num_tokens = x.shape[0]
        return gather_rows(x, order)

    @staticmethod
    def backward(ctx, g):
        (order,) = ctx.saved_tensors
        return gather_rows(g, inverse_order(order, ctx.num_tokens)), None


class _Unpermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, expert_out, order, gate, num_tokens):
        inv = inverse_order(order, num_tokens)
        ctx.save_for_backward(expert_out, order, gate)
        return gather_rows(expert_out, inv, gate)

    @staticmethod
    def backward(ctx, g):
        expert_out, order, gate = ctx.saved_tensors
        g = rows_2d(g)
        k, d = expert_out.shape
        d_eo = torch.empty_like(expert_out)
        dgate_rows = torch.empty((k,), dtype=torch.float32, device=g.device)
        if k and d:
            _unpermute_bwd[(k,)](
                g, expert_out, order.contiguous(), gate.contiguous(), d_eo, dgate_rows, d,
                g.stride(0), expert_out.stride(0), d_eo.stride(0),
            )
        dgate = torch.zeros(gate.shape, dtype=gate.dtype, device=gate.device)
        dgate[order] = dgate_rows.to(gate.dtype)
        return d_eo, None, dgate, None


def moe_permute(x: torch.Tensor, expert_index: torch.Tensor, num_experts: int):
    order, counts = reference.expert_order(expert_index, num_experts)
    return _Permute.apply(x, order), order, counts


def moe_unpermute(expert_out: torch.Tensor, order: torch.Tensor, gate: torch.Tensor, num_tokens: int) -> torch.Tensor:
    return _Unpermute.apply(rows_2d(expert_out), order, gate, num_tokens)
