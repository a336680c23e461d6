"""Partial rotary embedding (NeoX rotate-half on the first rotary_dim channels), Triton.

x: (B, S, H, dh) with any strides except a unit stride on dh; cos, sin: (B or 1, S, rotary_dim).
With half = rotary_dim / 2, x1 = x[..., :half], x2 = x[..., half:rotary_dim]:
    y1 = x1 * cos1 - x2 * sin1,   y2 = x2 * cos2 + x1 * sin2
and the backward is the transposed map:
    dx1 = g1 * cos1 + g2 * sin2,  dx2 = g2 * cos2 - g1 * sin1.
`apply_partial_rope_` rotates x in place (the pass-through channels are not touched at all);
`apply_partial_rope` writes a new tensor, as the reference does. cos and sin get no gradient.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from megatron_zaya.kernels._triton_common import INTERPRET, next_pow2

# No autotuning: the in-place variant writes its input, so benchmarking configs would rotate x
# several times. A program covers BLOCK_H heads of one token (about 1K elements on a GPU).


@triton.jit
def _rope_kernel(
    x_ptr, y_ptr, cos_ptr, sin_ptr,
    S, H, HALF, PASS,
    sxb, sxs, sxh, syb, sys, syh, scb, scs, ssb, sss,
    BACKWARD: tl.constexpr, COPY_PASS: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr, BLOCK_H: tl.constexpr,
):
    pid = tl.program_id(0)
    b = (pid // S).to(tl.int64)
    s = (pid % S).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_HALF)
    dmask = d < HALF
    mask = (heads[:, None] < H) & dmask[None, :]
    c_base = cos_ptr + b * scb + s * scs
    s_base = sin_ptr + b * ssb + s * sss
    cos1 = tl.load(c_base + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    cos2 = tl.load(c_base + HALF + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    sin1 = tl.load(s_base + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    sin2 = tl.load(s_base + HALF + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    x_rows = x_ptr + b * sxb + s * sxs + heads[:, None].to(tl.int64) * sxh
    y_rows = y_ptr + b * syb + s * sys + heads[:, None].to(tl.int64) * syh
    x1 = tl.load(x_rows + d[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_rows + HALF + d[None, :], mask=mask, other=0.0).to(tl.float32)
    if BACKWARD:
        y1 = x1 * cos1 + x2 * sin2
        y2 = x2 * cos2 - x1 * sin1
    else:
        y1 = x1 * cos1 - x2 * sin1
        y2 = x2 * cos2 + x1 * sin2
    tl.store(y_rows + d[None, :], y1.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_rows + HALF + d[None, :], y2.to(y_ptr.dtype.element_ty), mask=mask)
    if COPY_PASS:
        p = tl.arange(0, BLOCK_PASS)
        pmask = (heads[:, None] < H) & (p[None, :] < PASS)
        xp = tl.load(x_rows + 2 * HALF + p[None, :], mask=pmask, other=0.0)
        tl.store(y_rows + 2 * HALF + p[None, :], xp.to(y_ptr.dtype.element_ty), mask=pmask)


def _launch(x: torch.Tensor, y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool, copy_pass: bool):
    bsz, seq, heads, dh = x.shape
    rotary_dim = cos.shape[-1]
    if rotary_dim % 2 or rotary_dim > dh:
        raise ValueError(f"rotary_dim {rotary_dim} must be even and <= head dim {dh}")
    half, pas = rotary_dim // 2, dh - rotary_dim
    cos = cos.expand(bsz, seq, rotary_dim) if cos.shape[0] == 1 and bsz != 1 else cos
    sin = sin.expand(bsz, seq, rotary_dim) if sin.shape[0] == 1 and bsz != 1 else sin
    if cos.stride(-1) != 1:
        cos = cos.contiguous()
    if sin.stride(-1) != 1:
        sin = sin.contiguous()
    if bsz * seq * heads == 0:
        return
    block_h = 4 if INTERPRET else max(1, min(next_pow2(heads), 1024 // next_pow2(dh)))
    _rope_kernel[(bsz * seq, triton.cdiv(heads, block_h))](
        x, y, cos, sin, seq, heads, half, pas,
        x.stride(0), x.stride(1), x.stride(2), y.stride(0), y.stride(1), y.stride(2),
        cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        BACKWARD=backward, COPY_PASS=copy_pass and pas > 0,
        BLOCK_HALF=next_pow2(half), BLOCK_PASS=next_pow2(pas), BLOCK_H=block_h,
        num_warps=1 if INTERPRET else 4,
    )


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        xin = _unit_last(x)
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        _launch(xin, y, cos, sin, backward=False, copy_pass=True)
        ctx.save_for_backward(cos, sin)
        return y

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        g = _unit_last(g)
        dx = torch.empty(g.shape, dtype=g.dtype, device=g.device)
        _launch(g, dx, cos, sin, backward=True, copy_pass=True)
        return dx, None, None


class _RopeInplace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        if x.stride(-1) != 1:
            raise ValueError("apply_partial_rope_: x needs a unit stride on the head dim")
        if any(stride == 0 and size > 1 for size, stride in zip(x.shape, x.stride())):   # e.g. an expanded K/V head
            raise RuntimeError("apply_partial_rope_: x has elements sharing memory (an expanded view); "
                             "rotating it in place would rotate them more than once")
        _launch(x, x, cos, sin, backward=False, copy_pass=False)
        ctx.mark_dirty(x)
        ctx.save_for_backward(cos, sin)
        return x

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        g = _unit_last(g)
        dx = torch.empty(g.shape, dtype=g.dtype, device=g.device)
        _launch(g, dx, cos, sin, backward=True, copy_pass=True)
        return dx, None, None


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return _Rope.apply(x, cos, sin)


def apply_partial_rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return _RopeInplace.apply(x, cos, sin)


def apply_partial_rope_qk_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    return _RopeInplace.apply(q, cos, sin), _RopeInplace.apply(k, cos, sin)
