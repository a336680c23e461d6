"""Partial RoPE kernels (out of place and in place) vs reference.apply_partial_rope.

Tolerance: fp32 atol = rtol = 1e-5 (a rotation: one multiply-add per output element)."""
import pytest
import torch

from megatron_zaya.kernels import reference as R
from megatron_zaya.kernels import triton_rope as T

TOL = dict(atol=1e-5, rtol=1e-5)


def _cos_sin(b, s, rotary_dim, gen):
    # Arbitrary angles, and different values in the two halves so a mix-up of halves fails.
    ang = torch.randn(b, s, rotary_dim, generator=gen) * 3
    return torch.cos(ang), torch.sin(ang)


def _fwd_bwd(fn, x0, cos, sin, g, inplace=False):
    leaf = x0.detach().clone().requires_grad_(True)
    x = leaf * 1.0 if inplace else leaf  # in-place ops need a non-leaf
    y = fn(x, cos, sin)
    y.backward(g)
    return y.detach(), leaf.grad


@pytest.mark.parametrize(
    "b,s,h,dh,rd,cos_b",
    [(2, 3, 5, 16, 8, 1), (1, 4, 3, 12, 12, 1), (2, 2, 9, 20, 6, 2)],
)
def test_rope_out_of_place(b, s, h, dh, rd, cos_b):
    gen = torch.Generator().manual_seed(b * 100 + h * 10 + rd)
    x = torch.randn(b, s, h, dh, generator=gen)
    cos, sin = _cos_sin(cos_b, s, rd, gen)
    g = torch.randn(b, s, h, dh, generator=gen)
    y, gx = _fwd_bwd(T.apply_partial_rope, x, cos, sin, g)
    yr, gxr = _fwd_bwd(R.apply_partial_rope, x, cos, sin, g)
    torch.testing.assert_close(y, yr, **TOL)
    torch.testing.assert_close(gx, gxr, **TOL)


def test_rope_in_place_on_strided_view():
    """q as a view into a packed projection (head stride != dh), rotated in place."""
    gen = torch.Generator().manual_seed(7)
    b, s, h, dh, rd = 2, 3, 4, 16, 8
    packed = torch.randn(b, s, h, 2 * dh, generator=gen)
    cos, sin = _cos_sin(1, s, rd, gen)
    g = torch.randn(b, s, h, dh, generator=gen)

    def run(fn):
        leaf = packed.clone().requires_grad_(True)
        base = leaf * 1.0
        q = base[..., :dh]
        out = fn(q, cos, sin)
        assert out.data_ptr() == q.data_ptr()
        (out * g).sum().backward()
        return base.detach(), leaf.grad

    base_t, grad_t = run(T.apply_partial_rope_)
    base_r, grad_r = run(R.apply_partial_rope_)
    torch.testing.assert_close(base_t, base_r, **TOL)  # the untouched half of packed stays equal too
    torch.testing.assert_close(grad_t, grad_r, **TOL)


def test_rope_in_place_refuses_heads_sharing_memory():
    """A K/V head expanded over the query heads (stride 0): rotating it in place would rotate the shared
    memory once per head, so both the reference (torch's overlap check) and the kernel refuse it."""
    gen = torch.Generator().manual_seed(0)
    cos, sin = _cos_sin(1, 2, 4, gen)
    k = torch.randn(1, 2, 1, 8, generator=gen)
    for fn in (R.apply_partial_rope_, T.apply_partial_rope_):
        shared = k.clone()
        with pytest.raises(RuntimeError):
            fn(shared.expand(1, 2, 4, 8), cos, sin)
        assert torch.equal(shared, k), fn


def test_rope_rejects_odd_rotary_dim():
    with pytest.raises(ValueError):
        T.apply_partial_rope(torch.randn(1, 2, 1, 8), torch.ones(1, 2, 3), torch.zeros(1, 2, 3))


def test_rope_qk_in_place(triton_backend):
    gen = torch.Generator().manual_seed(9)
    q0, k0 = torch.randn(1, 3, 4, 16, generator=gen), torch.randn(1, 3, 2, 16, generator=gen)
    cos, sin = _cos_sin(1, 3, 8, gen)
    gq, gk = torch.randn(q0.shape, generator=gen), torch.randn(k0.shape, generator=gen)

    def run(fn):
        lq, lk = q0.clone().requires_grad_(True), k0.clone().requires_grad_(True)
        q, k = lq * 1.0, lk * 1.0
        q_out, k_out = fn(q, k, cos, sin)
        assert q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()
        ((q_out * gq).sum() + (k_out * gk).sum()).backward()
        return q.detach(), k.detach(), lq.grad, lk.grad

    for got, want in zip(run(triton_backend.apply_partial_rope_qk_), run(R.apply_partial_rope_qk_)):
        torch.testing.assert_close(got, want, **TOL)
