"""Fused RMSNorm / residual-merge kernels vs reference.py, forward and backward (interpreter).

Tolerances: fp32 inputs, atol = rtol = 1e-5 (outputs and input grads; parameter grads are sums
over rows, atol = rtol = 2e-5). bf16 storage: the kernel rounds once from fp32 where the reference
may round twice, so atol = rtol = 1.6e-2 (two bf16 ulps)."""
import pytest
import torch

from megatron_zaya.kernels import reference as R
from megatron_zaya.kernels import triton_rmsnorm as T

FP32 = dict(atol=1e-5, rtol=1e-5)
FP32_SUM = dict(atol=2e-5, rtol=2e-5)
BF16 = dict(atol=1.6e-2, rtol=1.6e-2)


def _leaf(*shape, dtype=torch.float32, gen=None, scale=1.0, shift=0.0):
    return (torch.randn(*shape, generator=gen) * scale + shift).to(dtype).requires_grad_(True)


def _grads(fn, inputs, seed):
    for t in inputs:
        t.grad = None
    outs = fn(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    gen = torch.Generator().manual_seed(seed)
    loss = sum((o.float() * torch.randn(o.shape, generator=gen)).sum() for o in outs)
    loss.backward()
    return [o.detach() for o in outs], [t.grad.clone() for t in inputs]


@pytest.mark.parametrize("shape", [(5, 37), (2, 3, 64), (4, 130)])
def test_rms_norm_fp32(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    x = _leaf(*shape, gen=gen, scale=3.0)
    w = _leaf(shape[-1], gen=gen, shift=1.0)
    (y,), (gx, gw) = _grads(lambda a, b: T.rms_norm(a, b, 1e-5), [x, w], 1)
    (yr,), (gxr, gwr) = _grads(lambda a, b: R.rms_norm(a, b, 1e-5), [x, w], 1)
    assert y.shape == yr.shape and y.dtype == yr.dtype
    torch.testing.assert_close(y, yr, **FP32)
    torch.testing.assert_close(gx, gxr, **FP32)
    torch.testing.assert_close(gw, gwr, **FP32_SUM)


def test_rms_norm_bf16_input_fp32_weight():
    gen = torch.Generator().manual_seed(3)
    x = _leaf(6, 50, dtype=torch.bfloat16, gen=gen)
    w = _leaf(50, gen=gen, shift=1.0)
    (y,), (gx, gw) = _grads(lambda a, b: T.rms_norm(a, b, 1e-5), [x, w], 2)
    (yr,), (gxr, gwr) = _grads(lambda a, b: R.rms_norm(a, b, 1e-5), [x, w], 2)
    assert y.dtype == yr.dtype == torch.float32 and gx.dtype == torch.bfloat16
    torch.testing.assert_close(y, yr, **BF16)
    torch.testing.assert_close(gx.float(), gxr.float(), **BF16)
    torch.testing.assert_close(gw, gwr, **BF16)


def _residual_inputs(shape, out_dtype, gen, scalar_scales=False):
    d = shape[-1]
    pshape = (1,) if scalar_scales else (d,)
    out = _leaf(*shape, dtype=out_dtype, gen=gen)
    res = _leaf(*shape, gen=gen, scale=2.0)
    params = [_leaf(*pshape, gen=gen, scale=0.3, shift=s) for s in (1.0, 0.0, 1.0, 0.0)]
    w = _leaf(d, gen=gen, scale=0.2, shift=1.0)
    return [out, res, *params, w]


@pytest.mark.parametrize("shape,scalar_scales", [((3, 5, 48), False), ((7, 33), False), ((4, 20), True)])
def test_scaled_residual_add_rms_norm_fp32(shape, scalar_scales):
    gen = torch.Generator().manual_seed(len(shape) + shape[-1])
    inputs = _residual_inputs(shape, torch.float32, gen, scalar_scales)
    fn_t = lambda *a: T.scaled_residual_add_rms_norm(*a, 1e-5)  # noqa: E731
    fn_r = lambda *a: R.scaled_residual_add_rms_norm(*a, 1e-5)  # noqa: E731
    outs, grads = _grads(fn_t, inputs, 5)
    outs_r, grads_r = _grads(fn_r, inputs, 5)
    for o, o_r in zip(outs, outs_r):
        assert o.dtype == o_r.dtype and o.shape == o_r.shape
        torch.testing.assert_close(o, o_r, **FP32)
    torch.testing.assert_close(grads[0], grads_r[0], **FP32)
    torch.testing.assert_close(grads[1], grads_r[1], **FP32)
    for g, g_r in zip(grads[2:], grads_r[2:]):
        assert g.shape == g_r.shape
        torch.testing.assert_close(g, g_r, **FP32_SUM)


def test_scaled_residual_add_rms_norm_bf16_out_and_norm_dtype():
    gen = torch.Generator().manual_seed(11)
    inputs = _residual_inputs((6, 40), torch.bfloat16, gen)
    fn_t = lambda *a: T.scaled_residual_add_rms_norm(*a, 1e-5, torch.bfloat16)  # noqa: E731
    fn_r = lambda *a: R.scaled_residual_add_rms_norm(*a, 1e-5, torch.bfloat16)  # noqa: E731
    (res, normed), grads = _grads(fn_t, inputs, 6)
    (res_r, normed_r), grads_r = _grads(fn_r, inputs, 6)
    assert res.dtype == torch.float32 and normed.dtype == torch.bfloat16
    torch.testing.assert_close(res, res_r, **FP32)
    torch.testing.assert_close(normed.float(), normed_r.float(), **BF16)
    assert grads[0].dtype == torch.bfloat16
    for g, g_r in zip(grads, grads_r):
        torch.testing.assert_close(g.float(), g_r.float(), **BF16)


def test_only_normed_output_used():
    """Backward with no gradient for new_residual (dnewres is None in the Function)."""
    gen = torch.Generator().manual_seed(12)
    inputs = _residual_inputs((5, 24), torch.float32, gen)
    fn_t = lambda *a: T.scaled_residual_add_rms_norm(*a, 1e-5)[1]  # noqa: E731
    fn_r = lambda *a: R.scaled_residual_add_rms_norm(*a, 1e-5)[1]  # noqa: E731
    _, grads = _grads(fn_t, inputs, 7)
    _, grads_r = _grads(fn_r, inputs, 7)
    for g, g_r in zip(grads, grads_r):
        torch.testing.assert_close(g, g_r, **FP32_SUM)


def test_scaled_residual_add():
    gen = torch.Generator().manual_seed(13)
    inputs = _residual_inputs((9, 19), torch.float32, gen)[:6]
    outs, grads = _grads(T.scaled_residual_add, inputs, 8)
    outs_r, grads_r = _grads(R.scaled_residual_add, inputs, 8)
    torch.testing.assert_close(outs[0], outs_r[0], **FP32)
    for g, g_r in zip(grads, grads_r):
        torch.testing.assert_close(g, g_r, **FP32_SUM)


def test_rms_norm_of_small_rows_keeps_eps_inside_the_square_root():
    """Rows whose mean square is near eps (scales 1e-4 .. 1, D = 37: a ragged block), forward and input and
    weight gradients against the float64 definition w * x / sqrt(mean(x^2) + eps) (1e-5 / 1e-4)."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(6, 37, generator=gen) * torch.logspace(-4, 0, 6)[:, None]).requires_grad_(True)
    w = (torch.randn(37, generator=gen) + 1).requires_grad_(True)
    y = T.rms_norm(x, w, 1e-5)
    x64, w64 = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    y64 = w64 * x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5)
    g = torch.randn(y.shape, generator=gen)
    y.backward(g)
    y64.backward(g.double())
    torch.testing.assert_close(y.double(), y64, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(w.grad.double(), w64.grad, atol=1e-4, rtol=1e-4)
