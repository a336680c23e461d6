"""Batched Newton-Schulz kernels vs reference.newton_schulz (interpreter, run in fp32).

Tolerance: atol = rtol = 1e-4 after 5 steps (fp32 matmuls summed in different orders; the
iteration is contracting on the converged singular values, so differences do not blow up)."""
import pytest
import torch

from megatron_zaya.kernels import reference as R
from megatron_zaya.kernels import triton_newton_schulz as T

TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("shape", [(3, 20, 37), (2, 35, 18), (17, 17)])
def test_newton_schulz_fp32(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    g = torch.randn(*shape, generator=gen)
    got = T.newton_schulz(g, steps=5, dtype=torch.float32)
    want = R.newton_schulz(g, steps=5, dtype=torch.float32)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert got.is_contiguous(), got.stride()          # as the reference's (a tall input is worked on transposed)
    torch.testing.assert_close(got, want, **TOL)
    # and it does orthogonalise: singular values of the result sit in NS's band around 1
    sv = torch.linalg.svdvals(got.reshape(-1, *shape[-2:]))
    assert sv.min() > 0.5 and sv.max() < 1.3


def test_newton_schulz_many_groups_shapes():
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(18, 24, generator=gen), torch.randn(24, 18, generator=gen), torch.randn(18, 24, generator=gen)]
    got = T.newton_schulz_many(grads, steps=2, dtype=torch.float32)
    for g, out in zip(grads, got):
        torch.testing.assert_close(out, R.newton_schulz(g, steps=2, dtype=torch.float32), **TOL)


def test_newton_schulz_bf16_against_fp32():
    """bf16 as Muon runs it on a GPU: intermediates stored in bf16. (The interpreter's tl.dot takes
    fp32 operands, see _triton_common.dot_operand; a GPU multiplies the bf16 values themselves.)
    Against the fp32 reference: relative Frobenius error <= 3%, the bound of Muon's bf16 test
    (tests/optim/test_muon.py); measured here ~1%. Before dot_operand the interpreter gave ~1e10."""
    gen = torch.Generator().manual_seed(5)
    g = torch.randn(2, 20, 37, generator=gen)
    got = T.newton_schulz(g.bfloat16(), steps=5, dtype=torch.bfloat16)
    want = R.newton_schulz(g, steps=5, dtype=torch.float32)
    assert got.dtype == torch.bfloat16
    assert ((got.float() - want).norm() / want.norm()).item() <= 3e-2


def test_newton_schulz_of_a_zero_matrix_is_zero():
    """An expert that received no tokens has an all-zero gradient: the eps of the normalisation keeps Muon's
    direction finite (zero), as the reference's."""
    z = torch.zeros(2, 16, 24)
    got = T.newton_schulz(z, steps=2, dtype=torch.float32)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, R.newton_schulz(z, steps=2, dtype=torch.float32))
