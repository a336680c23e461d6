"""reference.rms_norm and reference.scaled_residual_add: autograd functions with their backward written out,
against the composed torch ops of their definitions (float64 gradcheck, and outputs and gradients in the
dtype mixes the model uses)."""
import pytest
import torch

from megatron_zaya.kernels import reference


def composed_rms_norm(x, weight, eps):
    """The definition: weight * (x / sqrt(mean(x^2) + eps)), the normalised x rounded to x's dtype."""
    x_c = x.to(torch.promote_types(x.dtype, torch.float32))
    return weight * (x_c * torch.rsqrt(x_c.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def composed_merge(out, residual, out_scale, out_bias, res_scale, res_bias):
    """The definition: (out + out_bias) * out_scale + (residual + res_bias) * res_scale, in residual's dtype."""
    return (out.to(residual.dtype) + out_bias) * out_scale + (residual + res_bias) * res_scale


def run(fn, tensors, grad, *extra):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves, *extra)
    out.backward(grad)
    return [out.detach()] + [t.grad for t in leaves]


def randn(*shape, dtype=torch.float64, seed=0, offset=0.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + offset).to(dtype)


def assert_close(got, want, tolerance):
    """Each tensor's largest difference relative to its largest entry; dtypes must agree."""
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        assert ((g.double() - w.double()).abs().max() / w.double().abs().max()).item() < tolerance


def test_gradchecks_in_float64():
    x, weight = randn(3, 4, 6), randn(6, seed=1, offset=1.0)
    assert torch.autograd.gradcheck(lambda a, b: reference.rms_norm(a, b, 1e-5),
                                    (x.requires_grad_(), weight.requires_grad_()))
    merge_inputs = [randn(3, 4, 6, seed=2), randn(3, 4, 6, seed=3)] + [randn(6, seed=s) for s in range(4, 8)]
    assert torch.autograd.gradcheck(reference.scaled_residual_add, tuple(t.requires_grad_() for t in merge_inputs))


# (x, weight) dtypes: the fp32 residual stream with fp32 weights, or with bf16 weights (--bf16 with
# --use-distributed-optimizer stores them so), the whole-model check's float64, and a bf16 input.
@pytest.mark.parametrize("x_dtype, w_dtype, tolerance", [
    (torch.float64, torch.float64, 1e-13), (torch.float32, torch.float32, 2e-6),
    (torch.float32, torch.bfloat16, 1e-2), (torch.bfloat16, torch.float32, 2e-2)],
    ids=["float64", "float32", "fp32-bf16-weight", "bf16-input"])
def test_rms_norm_equals_the_composed_ops(x_dtype, w_dtype, tolerance):
    """Relative to each tensor's largest entry: ~1e-7 in fp32, and within a bf16 rounding (2^-8) where a
    result is bf16 (the sums run in other orders; the bf16 input case also rounds the normalised x)."""
    x, weight = randn(2, 5, 33, dtype=x_dtype), randn(33, seed=1, offset=1.0, dtype=w_dtype)
    grad = randn(2, 5, 33, seed=2, dtype=torch.promote_types(x_dtype, w_dtype))
    assert_close(run(reference.rms_norm, (x, weight), grad, 1e-5),
                 run(composed_rms_norm, (x, weight), grad, 1e-5), tolerance)


@pytest.mark.parametrize("out_dtype, param_dtype, tolerance", [
    (torch.float64, torch.float64, 1e-13), (torch.bfloat16, torch.float32, 1e-2),
    (torch.float32, torch.float32, 2e-6), (torch.bfloat16, torch.bfloat16, 1e-2)],
    ids=["float64", "bf16-out", "float32", "bf16-out-and-params"])
def test_scaled_residual_add_equals_the_composed_ops(out_dtype, param_dtype, tolerance):
    """The residual in float64 or fp32 (the residual stream); the sublayer output and the four parameters
    in the dtypes the model gives them. The gradients come back in each input's dtype (bf16 ones: within
    a bf16 rounding)."""
    residual_dtype = torch.float64 if out_dtype == torch.float64 else torch.float32
    tensors = [randn(2, 5, 33, dtype=out_dtype), randn(2, 5, 33, seed=1, dtype=residual_dtype)]
    tensors += [randn(33, seed=s, offset=1.0 if s % 2 == 0 else 0.0, dtype=param_dtype) for s in range(2, 6)]
    grad = randn(2, 5, 33, seed=9, dtype=residual_dtype)
    assert_close(run(reference.scaled_residual_add, tensors, grad),
                 run(composed_merge, tensors, grad), tolerance)


def saved_bytes(fn, *args) -> int:
    """Bytes of the tensors autograd keeps for fn's backward (leaves not counted: they live anyway)."""
    total = 0

    def pack(t):
        nonlocal total
        if t.grad_fn is not None or not t.requires_grad:
            total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return total


def test_they_keep_their_inputs_and_rstd_only():
    """The norm keeps x (here a non-leaf, counted) and one fp32 rstd per row; the merge keeps its two inputs
    (counted: non-leaves) and nothing else, where the composed ops kept fp32 copies of the whole size."""
    base = torch.randn(4, 8, 16, requires_grad=True)
    x = base * 1.0                                                  # a non-leaf: counted
    weight = torch.ones(16, requires_grad=True)
    rows = 4 * 8
    assert saved_bytes(reference.rms_norm, x, weight, 1e-5) == x.numel() * 4 + rows * 4
    assert saved_bytes(composed_rms_norm, x, weight, 1e-5) > 2 * x.numel() * 4
    out = (base * 1.0).to(torch.bfloat16)
    params = [torch.ones(16, requires_grad=True) for _ in range(4)]
    assert saved_bytes(reference.scaled_residual_add, out, x, *params) == out.numel() * 2 + x.numel() * 4


def test_the_fused_merge_and_norm_uses_the_norms_own_epsilon():
    """ResidualScaling.forward_and_norm (the merge fused with the next RMSNorm, half the model's norms) against the
    composed definition in float64 with eps = 0.5, where another epsilon moves the output by ~1e-2 (every model test
    uses the default 1e-5, whose change hid inside their tolerances). Tolerance 1e-6 (fp32)."""
    from megatron_zaya.model.norm import ResidualScaling, RMSNorm
    gen = torch.Generator().manual_seed(0)
    out, residual = torch.randn(3, 16, generator=gen), torch.randn(3, 16, generator=gen)
    merge, norm = ResidualScaling(16), RMSNorm(16, eps=0.5)
    with torch.no_grad():
        for p in (*merge.parameters(), norm.weight):
            p.add_(0.3 * torch.randn(16, generator=gen))
    merged, normed = merge.forward_and_norm(out, residual, norm)
    args = [t.double() for t in (out, residual, merge.out_scale, merge.out_bias, merge.res_scale, merge.res_bias)]
    want = composed_merge(*args)
    assert torch.allclose(merged.double(), want, atol=1e-6)
    assert torch.allclose(normed.double(), composed_rms_norm(want, norm.weight.double(), 0.5), atol=1e-6)
