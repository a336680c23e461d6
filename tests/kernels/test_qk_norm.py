"""reference.qk_norm: CCA's QK-norm with its backward written out, against the composed torch ops."""
import math

import pytest
import torch

from megatron_zaya.kernels import reference


def composed(x, temperature):
    """The definition: x * sqrt(dh) / max(||x||, eps) * T, through autograd."""
    factor = math.sqrt(x.shape[-1]) / x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).eps)
    return x * (factor if temperature is None else factor * temperature.to(x.dtype)[:, None])


def inputs(dtype, with_temperature, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, 3, 16, generator=gen, dtype=torch.float64)
    x[0, 1, 2] = 0.0                        # a floored row: no projection term, no NaN
    temperature = torch.rand(3, generator=gen, dtype=torch.float64) + 0.5 if with_temperature else None
    grad = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    return x.to(dtype), None if temperature is None else temperature.to(torch.promote_types(dtype, torch.float32)), \
        grad.to(dtype)


def run(fn, x, temperature, grad):
    leaves = [t.detach().clone().requires_grad_() for t in (x, temperature) if t is not None]
    out = fn(leaves[0], leaves[1] if len(leaves) > 1 else None)
    out.backward(grad)
    return [out.detach()] + [t.grad for t in leaves]


@pytest.mark.parametrize("with_temperature", [False, True], ids=["queries", "keys"])
def test_gradcheck_in_float64(with_temperature):
    x, temperature, _ = inputs(torch.float64, with_temperature)
    x = x[:, 2:4, :, :6].contiguous()        # small enough for finite differences; no zero row (a kink)
    args = (x.requires_grad_(),) + ((temperature.requires_grad_(),) if with_temperature else (None,))
    assert torch.autograd.gradcheck(reference.qk_norm, args)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-14), (torch.float32, 1e-6), (torch.bfloat16, 2e-2)],
                         ids=["float64", "float32", "bf16"])
def test_equals_the_composed_ops(dtype, tolerance):
    """Output, input gradient and temperature gradient against autograd through the composed ops, relative
    to each tensor's largest entry (bf16: the composed ops round the norm itself to bf16, this one does not)."""
    x, temperature, grad = inputs(dtype, with_temperature=True)
    for got, want in zip(run(reference.qk_norm, x, temperature, grad), run(composed, x, temperature, grad)):
        assert got.dtype == want.dtype
        assert ((got.double() - want.double()).abs().max() / want.double().abs().max()).item() < tolerance
    floored_row_grad = run(reference.qk_norm, x, temperature, grad)[1][0, 1, 2]
    assert torch.isfinite(floored_row_grad).all() and floored_row_grad.abs().sum() > 0   # the linear regime, x * f
