"""Fused SwiGLU: silu(gate) * up over the two halves of the last dim (Triton, fwd + bwd).

Forward reads gate_up once and writes the product; backward recomputes the sigmoid from the
saved input and writes d(gate_up) in one pass:
    d_gate = g * up * s * (1 + gate * (1 - s)),  d_up = g * gate * s,  s = sigmoid(gate).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from megatron_zaya.kernels._triton_common import PRUNE, configs, rows_2d

_CONFIGS = configs(
    [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((512, 4), (1024, 4), (2048, 8), (4096, 8))],
    triton.Config({"BLOCK": 64}, num_warps=1),
)


@triton.autotune(configs=_CONFIGS, key=["H"], prune_configs_by=PRUNE)
@triton.jit
def _fwd_kernel(x_ptr, y_ptr, H, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < H
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + H + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.autotune(configs=_CONFIGS, key=["H"], prune_configs_by=PRUNE)
@triton.jit
def _bwd_kernel(x_ptr, g_ptr, dx_ptr, H, stride_x, stride_g, stride_dx, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < H
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + H + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(gate)
    d_gate = g * up * s * (1.0 + gate * (1.0 - s))
    d_up = g * gate * s
    tl.store(dx_ptr + row * stride_dx + cols, d_gate.to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(dx_ptr + row * stride_dx + H + cols, d_up.to(dx_ptr.dtype.element_ty), mask=mask)


def _grid(n, h):
    return lambda meta: (n, triton.cdiv(h, meta["BLOCK"]))


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate_up):
        if gate_up.shape[-1] % 2:
            raise ValueError("swiglu: the last dim must be even (gate and up halves)")
        x2 = rows_2d(gate_up)
        n, two_h = x2.shape
        h = two_h // 2
        y = torch.empty((n, h), dtype=gate_up.dtype, device=gate_up.device)
        if n * h:
            _fwd_kernel[_grid(n, h)](x2, y, h, x2.stride(0), y.stride(0))
        ctx.save_for_backward(gate_up)
        return y.view(*gate_up.shape[:-1], h)

    @staticmethod
    def backward(ctx, g):
        (gate_up,) = ctx.saved_tensors
        x2 = rows_2d(gate_up)
        g2 = rows_2d(g)
        n, two_h = x2.shape
        h = two_h // 2
        dx = torch.empty((n, two_h), dtype=gate_up.dtype, device=gate_up.device)
        if n * h:
            _bwd_kernel[_grid(n, h)](x2, g2, dx, h, x2.stride(0), g2.stride(0), dx.stride(0))
        return dx.view(gate_up.shape)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    return _SwiGLU.apply(gate_up)
