"""Causal attention for bf16 training on CPU: torch's flash forward, a blocked backward of bf16 matmuls.

torch's CPU flash-attention forward runs its bf16 products through oneDNN's small-matrix kernels
(AMX or AVX512-BF16), but its backward is 6-9x slower than the forward. On a 2-core Xeon with AMX, freed
memory kept in the process as training does (`bench/cpu_attention.py`): 8.0-8.5 ms against 0.9-1.2 ms
at zaya1-tiny's shape, 24-33 ms against 4-6 ms at zaya1-100m's; this backward takes 4.5 and 13 ms.
It recomputes the probabilities a block of query rows at a time and does the five products as batched
bf16 matmuls (fp32 accumulation), at the machine's bf16 matmul rate. Grouped K/V heads need no repeat:
the query heads of one K/V head are stacked as rows of one matmul ((B * HKV, G * rows, dh) against
(B * HKV, dh, keys)), and causality limits each block's keys to those up to its last row.

Rounding, with lse = the forward's fp32 log-sum-exp per row and delta = rowsum(dO * O):
  * s * scale - lse and dP - delta come out of single matmuls, [q * scale, -lse_hi, -lse_lo] . [k, 1, 1] and
    [dO, -delta_hi, -delta_lo] . [v, 1, 1], lse_hi + lse_lo = lse in bf16 to ~2^-16 (rounding lse to bf16
    would put up to 2^-9 * |lse| on every exponent of a row), accumulated in fp32 and rounded once;
    q * scale and k * scale are rounded to bf16 where scale is not a power of two.
  * P, dP - delta and dS are rounded to bf16 once each, as operands of bf16 matmuls.
The gradients' relative error against float64 is 0.9-1.7x the flash backward's own in bf16 (5.8-7.6e-3
against 4.4-8e-3; tests/kernels/test_cpu_attention.py allows 2x); in fp32 the same code matches float64
to ~2e-7.
"""
from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend

# Rows (query heads of a K/V head x query positions) per block: 512 measured best of 128..2048 at
# zaya1-tiny's and zaya1-100m's shapes (bench/cpu_attention.py --block-rows); the block's scores,
# (B * HKV, 512, keys) in bf16, stay small at any length.
BLOCK_ROWS = 512


def applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_mask) -> bool:
    """Whether causal_attention replaces SDPA for (B, H, S, dh) q and (B, HKV, S, dh) k, v: bf16 on CPU,
    causal without a mask, equal query and key lengths, gradients wanted, and SDPA itself would take its
    flash kernel (the one whose forward this reuses; not where a caller forces another backend with
    torch.nn.attention.sdpa_kernel or the strides rule flash out)."""
    return (attention_mask is None and q.device.type == "cpu"
            and q.dtype == k.dtype == v.dtype == torch.bfloat16
            and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
            and q.shape[-2] == k.shape[-2] and q.shape[1] % k.shape[1] == 0
            and torch._fused_sdp_choice(q, k, v, None, 0.0, True, enable_gqa=q.shape[1] != k.shape[1])
            == SDPBackend.FLASH_ATTENTION.value)


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


def future_bias(size: int, dtype, device) -> torch.Tensor:
    """(size, size): -inf above the diagonal (a later key), 0 elsewhere."""
    future = torch.ones(size, size, dtype=torch.bool, device=device).triu_(1)
    return torch.zeros(size, size, dtype=dtype, device=device).masked_fill_(future, float("-inf"))


def with_split_column(x: torch.Tensor, column: torch.Tensor | None, multiplier: float = 1.0) -> torch.Tensor:
    """(..., dh) x -> (..., dh + 2) in x's dtype: [x * multiplier, -hi, -lo] with hi + lo = column (an fp32
    (...,) tensor) to ~2^-16 relative, or [x * multiplier, 1, 1] for column None: a matmul of two such
    tensors adds -column to x . y in its fp32 accumulator. (dh + 2 keeps the width even, as the bf16
    matmul kernels' pairs of K want: an odd width ran 1.4x slower in a micro-benchmark at dh 64.)"""
    out = torch.empty(*x.shape[:-1], x.shape[-1] + 2, dtype=x.dtype, device=x.device)
    torch.mul(x, multiplier, out=out[..., :-2])
    if column is None:
        out[..., -2:] = 1
    else:
        high = column.to(x.dtype)
        out[..., -2] = high.neg()
        out[..., -1] = (high.float() - column).to(x.dtype)
    return out


def causal_attention_backward(grad_out, q, k, v, out, lse, block_rows: int = BLOCK_ROWS):
    """(dq, dk, dv) of causal softmax attention with grouped K/V heads; lse: (B, H, S) fp32 from the
    forward. The module docstring gives the blocking and the rounding."""
    batch, heads, seq, head_dim = q.shape
    kv_heads = k.shape[1]
    groups, n = heads // kv_heads, batch * kv_heads
    scale = head_dim ** -0.5
    width = head_dim + 2
    # s * scale - lse and dP - delta straight out of the matmuls: [q * scale, -lse] . [k, 1] and
    # [dO, -delta] . [v, 1], with delta = rowsum(dO * O) = rowsum(P * dP).
    delta = torch.linalg.vecdot(grad_out.float(), out.float())
    q_lse = with_split_column(q, lse, scale).view(n, groups, seq, width)
    g_delta = with_split_column(grad_out, delta).view(n, groups, seq, width)
    k_one = with_split_column(k, None).view(n, seq, width)
    v_one = with_split_column(v, None).view(n, seq, width)
    k_scaled = (k * scale).reshape(n, seq, head_dim)
    dq = torch.empty(n, groups, seq, head_dim, dtype=q.dtype, device=q.device)
    dk = torch.zeros(n, seq, head_dim, dtype=torch.float32, device=q.device)
    dv = torch.zeros_like(dk)
    block = max(1, block_rows // groups)
    for start in range(0, seq, block):
        stop = min(seq, start + block)
        m = stop - start
        qb = q_lse[:, :, start:stop].reshape(n, groups * m, width)
        gb = g_delta[:, :, start:stop].reshape(n, groups * m, width)
        # P over keys 0 .. stop - 1; the future of each row gets an added -inf (4x faster than
        # masked_fill_ with a broadcast mask on CPU).
        p = torch.bmm(qb, k_one[:, :stop].transpose(1, 2))
        p.view(n, groups, m, stop)[..., start:].add_(future_bias(m, q.dtype, q.device))
        p.exp_()
        dv[:, :stop] += torch.bmm(p.transpose(1, 2), gb[..., :head_dim])
        ds = torch.bmm(gb, v_one[:, :stop].transpose(1, 2)).mul_(p)     # dS = (dP - delta) * P
        dq[:, :, start:stop] = torch.bmm(ds, k_scaled[:, :stop]).view(n, groups, m, head_dim)
        dk[:, :stop] += torch.bmm(ds.transpose(1, 2), qb[..., :head_dim])     # qb holds q * scale
    return (dq.view(batch, heads, seq, head_dim), dk.to(q.dtype).view(batch, kv_heads, seq, head_dim),
            dv.to(q.dtype).view(batch, kv_heads, seq, head_dim))
