"""MoE permute / unpermute kernels vs reference.py, forward and backward (interpreter).

Tolerances: the permutes move values exactly (compared with equality); the gated unpermute and
its gate gradient (a length-D dot product) use fp32 atol = rtol = 1e-5."""
import pytest
import torch

from megatron_zaya.kernels import reference as R
from megatron_zaya.kernels import triton_moe_permute as T


def _routing(n, e, gen):
    idx = torch.randint(0, e + 1, (n,), generator=gen)  # e = the skip class
    idx[0] = e  # at least one skipped token
    return idx


@pytest.mark.parametrize("n,d,e", [(13, 37, 4), (8, 70, 3)])
def test_moe_permute_roundtrip(n, d, e):
    gen = torch.Generator().manual_seed(n * d)
    x0 = torch.randn(n, d, generator=gen)
    idx = _routing(n, e, gen)
    gate0 = torch.rand(n, generator=gen)
    w = torch.randn(n, d, generator=gen)

    def run(mod):
        x = x0.clone().requires_grad_(True)
        gate = gate0.clone().requires_grad_(True)
        perm, order, counts = mod.moe_permute(x, idx, e)
        expert_out = perm * torch.linspace(0.5, 2.0, perm.shape[0]).unsqueeze(-1)  # some "expert"
        out = mod.moe_unpermute(expert_out, order, gate, n)
        (out * w).sum().backward()
        return perm.detach(), order, counts, out.detach(), x.grad, gate.grad

    got, want = run(T), run(R)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    torch.testing.assert_close(got[3], want[3], atol=1e-5, rtol=1e-5)
    assert torch.all(got[3][idx == e] == 0)
    torch.testing.assert_close(got[4], want[4], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[5], want[5], atol=1e-5, rtol=1e-5)


def test_moe_permute_backward_exact():
    gen = torch.Generator().manual_seed(5)
    n, d, e = 11, 33, 3
    idx = _routing(n, e, gen)
    x = torch.randn(n, d, generator=gen, requires_grad=True)
    perm, order, _ = T.moe_permute(x, idx, e)
    g = torch.randn(perm.shape, generator=gen)
    perm.backward(g)
    want = torch.zeros(n, d).index_add(0, order, g)
    assert torch.equal(x.grad, want)


def test_moe_unpermute_bf16():
    gen = torch.Generator().manual_seed(6)
    n, d, e = 9, 40, 2
    idx = _routing(n, e, gen)
    x = torch.randn(n, d, generator=gen).to(torch.bfloat16)
    gate = torch.rand(n, generator=gen)
    perm, order, _ = T.moe_permute(x, idx, e)
    got = T.moe_unpermute(perm, order, gate, n)
    want = R.moe_unpermute(perm, order, gate, n)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), atol=1.6e-2, rtol=1.6e-2)
