"""Fused CCA causal convolution pair vs reference.cca_causal_conv (two F.conv1d), fwd + bwd.

Tolerance: fp32 atol = rtol = 1e-5 for the output and d(packed), d(left); 2e-5 for the weight
and bias gradients (sums over batch and time)."""
import pytest
import torch

from megatron_zaya.kernels import reference as R
from megatron_zaya.kernels import triton_cca_conv as T


def _params(c, dh, k1, k2, gen):
    return [
        (torch.randn(c, 1, k1, generator=gen) * 0.5).requires_grad_(True),
        (torch.randn(c, generator=gen) * 0.5).requires_grad_(True),
        (torch.randn(c, dh, k2, generator=gen) / dh ** 0.5).requires_grad_(True),
        (torch.randn(c, generator=gen) * 0.5).requires_grad_(True),
    ]


@pytest.mark.parametrize("b,s,groups,dh,k1,k2,with_left", [
    (2, 13, 2, 32, 2, 2, False),   # ZAYA1 kernel sizes, S not a multiple of the time block, 2 channel blocks
    (1, 20, 2, 12, 2, 2, True),    # dh not a power of two, left context from a previous chunk
    (2, 5, 2, 16, 3, 2, True),     # other kernel sizes
])
def test_cca_causal_conv(b, s, groups, dh, k1, k2, with_left):
    gen = torch.Generator().manual_seed(b * 1000 + s * 10 + dh)
    c = groups * dh
    packed0 = torch.randn(b, s, c, generator=gen)
    left0 = torch.randn(b, c, k1 - 1 + k2 - 1, generator=gen) if with_left else None
    params = _params(c, dh, k1, k2, gen)
    g = torch.randn(b, s, c, generator=gen)

    def run(fn):
        packed = packed0.clone().requires_grad_(True)
        left = left0.clone().requires_grad_(True) if with_left else None
        for p in params:
            p.grad = None
        out = fn(packed, *params, left)
        out.backward(g)
        grads = [packed.grad] + ([left.grad] if with_left else []) + [p.grad.clone() for p in params]
        return out.detach(), grads

    out, grads = run(T.cca_causal_conv)
    out_r, grads_r = run(R.cca_causal_conv)
    torch.testing.assert_close(out, out_r, atol=1e-5, rtol=1e-5)
    n_act = 2 if with_left else 1
    for gt, gr in zip(grads[:n_act], grads_r[:n_act]):
        torch.testing.assert_close(gt, gr, atol=1e-5, rtol=1e-5)
    for gt, gr in zip(grads[n_act:], grads_r[n_act:]):
        assert gt.shape == gr.shape
        torch.testing.assert_close(gt, gr, atol=2e-5, rtol=2e-5)


def test_cca_conv_matches_the_model_layout():
    """Same numbers as the nn.Conv1d pair on a (B, C, S) tensor, as megatron_zaya.model.cca uses it."""
    gen = torch.Generator().manual_seed(3)
    b, s, groups, dh = 2, 9, 2, 16
    c = groups * dh
    dw = torch.nn.Conv1d(c, c, 2, groups=c)
    gc = torch.nn.Conv1d(c, c, 2, groups=groups)
    x = torch.randn(b, s, c, generator=gen)
    want = gc(dw(torch.nn.functional.pad(x.transpose(1, 2), (2, 0)))).transpose(1, 2)
    got = T.cca_causal_conv(x, dw.weight, dw.bias, gc.weight, gc.bias)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_cca_causal_conv_bf16_as_the_model_calls_it():
    """Under bf16 autocast the model passes a bf16 packed tensor and fp32 conv parameters: the
    output and d(packed) come back in bf16, the parameter gradients in fp32, all within bf16
    rounding (atol = rtol = 3e-2) of the fp32 reference on the same bf16-rounded inputs.
    (Interpreted, tl.dot takes fp32 operands: _triton_common.dot_operand; before it, the
    interpreter's bf16 dot gave errors of ~1e10.)"""
    gen = torch.Generator().manual_seed(11)
    b, s, groups, dh = 2, 13, 2, 32
    c = groups * dh
    packed0 = torch.randn(b, s, c, generator=gen).bfloat16()
    params = _params(c, dh, 2, 2, gen)
    g = torch.randn(b, s, c, generator=gen).bfloat16()

    def run(fn, packed_dtype):
        packed = packed0.to(packed_dtype, copy=True).requires_grad_(True)
        for p in params:
            p.grad = None
        out = fn(packed, *params, None)
        out.backward(g.to(out.dtype))
        return out.detach(), packed.grad, [p.grad.clone() for p in params]

    out, d_packed, d_params = run(T.cca_causal_conv, torch.bfloat16)
    out_r, d_packed_r, d_params_r = run(R.cca_causal_conv, torch.float32)
    assert out.dtype == d_packed.dtype == torch.bfloat16
    assert all(d.dtype == torch.float32 for d in d_params)
    torch.testing.assert_close(out.float(), out_r, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(d_packed.float(), d_packed_r, atol=3e-2, rtol=3e-2)
    for got, want in zip(d_params, d_params_r):
        torch.testing.assert_close(got, want, atol=3e-2 * want.abs().max().item(), rtol=3e-2)


@pytest.mark.parametrize("rows, splits", [(4096, 16), (1280, 4), (4095, 1), (8, 1), (0, 1)])
def test_grouped_row_products_split_the_rows(rows, splits):
    """The conv weight gradient's reduction over B * S rows, cut into `splits` chunks (one batch of
    G * P products, then a sum): equal to the float64 einsum over all rows. fp32: rtol 1e-5."""
    gen = torch.Generator().manual_seed(rows)
    a, b = torch.randn(rows, 3, 8, generator=gen), torch.randn(rows, 3, 5, generator=gen)
    expected = torch.einsum("rgm,rgn->gmn", a.double(), b.double())
    got = T.grouped_row_products(a, b)
    assert got.shape == (3, 8, 5)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5 * max(rows, 1) ** 0.5)
    assert T.row_splits(rows) == splits


def test_an_empty_batch_has_zero_weight_gradients():
    """No rows (an empty micro-batch): the forward is empty and the backward gives zero gradients, as the
    reference does (the weight gradient's reduction raised on a reshape of 0 elements)."""
    gen = torch.Generator().manual_seed(0)
    packed = torch.randn(0, 3, 12, generator=gen).requires_grad_(True)
    params = _params(12, 4, 2, 2, gen)
    out = T.cca_causal_conv(packed, *params)
    assert out.shape == (0, 3, 12)
    out.sum().backward()
    assert all(p.grad is not None and not p.grad.any() for p in params)


def test_an_empty_sequence_has_zero_gradients():
    """No positions (S = 0) with a left context: the kernels are not launched, and the weights' and the
    context's gradients are zero (they were read from uninitialised memory), the output being empty."""
    gen = torch.Generator().manual_seed(0)
    params = [p.requires_grad_(True) for p in _params(12, 4, 2, 2, gen)]
    left = torch.randn(2, 12, 2, generator=gen).requires_grad_(True)
    torch.full((1 << 16,), 1e30).sum()      # leave non-zero bytes in the allocator's free memory
    out = T.cca_causal_conv(torch.randn(2, 0, 12, generator=gen).requires_grad_(True), *params, left)
    assert out.shape == (2, 0, 12)
    out.sum().backward()
    assert all(t.grad is not None and not t.grad.any() for t in (*params, left))


@pytest.mark.parametrize("b,s,groups,dh,k1,k2,boundaries", [
    (2, 13, 2, 32, 2, 2, [[4, 5, 11], [1, 12]]),   # ZAYA1's kernel sizes, a one-token document, ragged S
    (1, 11, 2, 12, 3, 2, [[2, 7]]),                 # longer depthwise kernel, dh not a power of two
    (2, 9, 1, 16, 2, 3, [[3], []]),                 # longer grouped kernel; one sequence is one document
])
def test_cca_causal_conv_segmented(b, s, groups, dh, k1, k2, boundaries):
    """The fused kernel with document visibility against reference.cca_causal_conv_segmented (shifted
    sums), output and every gradient, fp32. Tolerances as above. The visibility has one lag column more
    than the kernels read, as the model's (it also serves the value shift)."""
    from megatron_zaya.model.documents import lag_visibility_of_ids

    gen = torch.Generator().manual_seed(s * 100 + dh + k2)
    c = groups * dh
    starts = torch.zeros(b, s, dtype=torch.long)
    for row, cuts in enumerate(boundaries):
        starts[row, cuts] = 1
    visible = lag_visibility_of_ids(starts.cumsum(1), max(k1, k2))
    packed0 = torch.randn(b, s, c, generator=gen)
    params = _params(c, dh, k1, k2, gen)
    g = torch.randn(b, s, c, generator=gen)

    def run(fn):
        packed = packed0.clone().requires_grad_(True)
        for p in params:
            p.grad = None
        out = fn(packed, *params, visible)
        out.backward(g)
        return out.detach(), packed.grad, [p.grad.clone() for p in params]

    out, d_packed, d_params = run(T.cca_causal_conv_segmented)
    out_r, d_packed_r, d_params_r = run(R.cca_causal_conv_segmented)
    torch.testing.assert_close(out, out_r, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(d_packed, d_packed_r, atol=1e-5, rtol=1e-5)
    for got, want in zip(d_params, d_params_r):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    # A document boundary matters: without the visibility the output differs at the documents' starts.
    if any(boundaries):
        assert not torch.allclose(T.cca_causal_conv(packed0, *params), out, atol=1e-3)
