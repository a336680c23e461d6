"""Causal attention for bf16 training on CPU: torch's flash forward, a blocked backward of bf16 matmuls.

torch's CPU flash-attention forward runs its bf16 products through oneDNN's small-matrix kernels
(AMX or AVX512-BF16), but its backward is several times slower than the forward: on a 2-core Xeon
with AMX, 13-15 ms against 1.5 ms at zaya1-tiny's shape and ~40 ms against 6 ms at zaya1-100m's
(`bench/cpu_attention.py`). This backward recomputes the probabilities a block of query rows at a time
and does the five products as batched bf16 matmuls (fp32 accumulation), at the machine's bf16
matmul rate. Grouped K/V heads need no repeat: the query heads of one K/V head are stacked as rows of
one matmul ((B * HKV, G * rows, dh) against (B * HKV, dh, keys)), and causality limits each block's
keys to those up to its last row.

Rounding, per block, with lse = the forward's fp32 log-sum-exp per row:
  * exp(s * scale - lse) is computed as exp(s * scale - bf16(lse)) * c, c = exp(bf16(lse) - lse), with
    the bf16 bias folded into the score matmul (baddbmm: one rounding of the result) and the per-row
    factor c moved onto the small (rows, dh) operands and results. Rounding lse itself would put up to
    2^-9 * |lse| on every exponent of a row.
  * P, dP - delta and dS are rounded to bf16 once each, as operands of bf16 matmuls.
The gradients' relative error against float64 is 1.0-1.7x the flash backward's own in bf16 (6-9e-3 against
4-8e-3; tests/kernels/test_cpu_attention.py allows 2x); in fp32 the same code matches float64 to ~2e-7.
"""
from __future__ import annotations

import torch

# Rows (query heads of a K/V head x query positions) per block: 512 measured best of 128..2048 at
# zaya1-tiny's and zaya1-100m's shapes (bench/cpu_attention.py --block-rows); the block's scores,
# (B * HKV, 512, keys) in bf16, stay small at any length.
BLOCK_ROWS = 512


def applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_mask) -> bool:
    """Whether causal_attention replaces SDPA for (B, H, S, dh) q and (B, HKV, S, dh) k, v: bf16 on CPU,
    causal without a mask, equal query and key lengths, gradients wanted."""
    return (attention_mask is None and q.device.type == "cpu"
            and q.dtype == k.dtype == v.dtype == torch.bfloat16
            and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
            and q.shape[-2] == k.shape[-2] and q.shape[1] % k.shape[1] == 0)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_rows: int = BLOCK_ROWS):
    """= F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) (the same forward
    kernel), with the blocked backward of this module."""
    return _CausalAttention.apply(q, k, v, block_rows)


class _CausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, block_rows):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.block_rows = block_rows
        return out

    @staticmethod
    def backward(ctx, grad_out):
        return (*causal_attention_backward(grad_out, *ctx.saved_tensors, ctx.block_rows), None)


def causal_attention_backward(grad_out, q, k, v, out, lse, block_rows: int = BLOCK_ROWS):
    """(dq, dk, dv) of causal softmax attention with grouped K/V heads; lse: (B, H, S) fp32 from the
    forward. The module docstring gives the blocking and the rounding."""
    batch, heads, seq, head_dim = q.shape
    kv_heads = k.shape[1]
    groups, n = heads // kv_heads, batch * kv_heads
    scale = head_dim ** -0.5
    dtype = q.dtype
    q_rows, g_rows = q.reshape(n, groups, seq, head_dim), grad_out.reshape(n, groups, seq, head_dim)
    keys, values = k.reshape(n, seq, head_dim), v.reshape(n, seq, head_dim)
    lse_low = lse.to(dtype)
    row_factor = torch.exp(lse_low.float() - lse).reshape(n, groups, seq, 1)
    neg_lse = lse_low.neg_().reshape(n, groups, seq, 1)
    # delta = rowsum(dO * O) = rowsum(P * dP), subtracted from dP inside the dP matmul.
    neg_delta = (grad_out.float() * out.float()).sum(-1).neg_().to(dtype).reshape(n, groups, seq, 1)
    dq = torch.empty(n, groups, seq, head_dim, dtype=dtype, device=q.device)
    dk = torch.zeros(n, seq, head_dim, dtype=torch.float32, device=q.device)
    dv = torch.zeros_like(dk)
    block = max(1, block_rows // groups)
    for start in range(0, seq, block):
        stop = min(seq, start + block)
        rows = groups * (stop - start)
        qb = q_rows[:, :, start:stop].reshape(n, rows, head_dim)
        gb = g_rows[:, :, start:stop].reshape(n, rows, head_dim)
        c = row_factor[:, :, start:stop].reshape(n, rows, 1)
        kb, vb = keys[:, :stop], values[:, :stop]
        # p = exp(s * scale - lse) / c, over keys 0 .. stop - 1, the future of each row masked.
        p = torch.baddbmm(neg_lse[:, :, start:stop].reshape(n, rows, 1), qb, kb.transpose(1, 2), alpha=scale)
        future = torch.ones(stop - start, stop - start, dtype=torch.bool, device=q.device).triu_(1)
        p.view(n, groups, stop - start, stop)[..., start:].masked_fill_(future, float("-inf"))
        p.exp_()
        dv[:, :stop] += torch.bmm(p.transpose(1, 2), (gb * c).to(dtype))
        # ds = (dP - delta) * p = dS / c
        ds = torch.baddbmm(neg_delta[:, :, start:stop].reshape(n, rows, 1), gb, vb.transpose(1, 2)).mul_(p)
        dq[:, :, start:stop] = (torch.bmm(ds, kb) * (c * scale)).to(dtype).view(n, groups, stop - start, head_dim)
        dk[:, :stop] += torch.bmm(ds.transpose(1, 2), (qb * c).to(dtype))
    return (dq.view(batch, heads, seq, head_dim), dk.mul_(scale).to(dtype).view(batch, kv_heads, seq, head_dim),
            dv.to(dtype).view(batch, kv_heads, seq, head_dim))
