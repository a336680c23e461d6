"""Fused SwiGLU vs reference.swiglu, forward and backward (interpreter).

Tolerances: fp32 atol = rtol = 1e-5; bf16 atol = rtol = 1.6e-2 (the kernel rounds once from fp32,
the reference rounds silu(gate) to bf16 before the product)."""
import pytest
import torch

from megatron_zaya.kernels import reference as R
from megatron_zaya.kernels import triton_swiglu as T


def _run(fn, x, g):
    x = x.detach().clone().requires_grad_(True)
    y = fn(x)
    y.backward(g)
    return y.detach(), x.grad


@pytest.mark.parametrize("shape", [(3, 2 * 37), (2, 5, 2 * 64), (7, 2 * 130)])
def test_swiglu_fp32(shape):
    gen = torch.Generator().manual_seed(shape[-1])
    x = torch.randn(*shape, generator=gen) * 3
    g = torch.randn(*shape[:-1], shape[-1] // 2, generator=gen)
    y, gx = _run(T.swiglu, x, g)
    yr, gxr = _run(R.swiglu, x, g)
    assert y.shape == yr.shape
    torch.testing.assert_close(y, yr, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gx, gxr, atol=1e-5, rtol=1e-5)


def test_swiglu_bf16_and_noncontiguous_rows():
    gen = torch.Generator().manual_seed(1)
    packed = torch.randn(6, 3 * 40, generator=gen).to(torch.bfloat16)
    x = packed[:, :80]  # rows with stride 120: a view, not a copy
    g = torch.randn(6, 40, generator=gen).to(torch.bfloat16)
    y, gx = _run(T.swiglu, x, g)
    yr, gxr = _run(R.swiglu, x, g)
    assert y.dtype == gx.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), yr.float(), atol=1.6e-2, rtol=1.6e-2)
    torch.testing.assert_close(gx.float(), gxr.float(), atol=1.6e-2, rtol=1.6e-2)


def test_swiglu_odd_width_rejected():
    with pytest.raises(ValueError):
        T.swiglu(torch.randn(2, 5))
