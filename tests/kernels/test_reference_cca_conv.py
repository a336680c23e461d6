"""reference.cca_causal_conv (two channels-last convolutions) against CCA's conv pair written out as
sums over the taps in float64: outputs and gradients, with and without the preceding steps (`left`),
in fp32 and in bf16 under autocast (the training path on CPU)."""
import pytest
import torch

from megatron_zaya.kernels import reference


def taps_conv(packed, dw_weight, dw_bias, g_weight, g_bias, left=None):
    """The definition, float64: zero-padded (or `left`-extended) input, depthwise conv over time, then a
    grouped conv over time, each output step reading its own and earlier steps only."""
    b, s, c = packed.shape
    k1, k2 = dw_weight.shape[-1], g_weight.shape[-1]
    context = k1 - 1 + k2 - 1
    before = torch.zeros(b, context, c, dtype=packed.dtype) if left is None else left.transpose(1, 2)
    x = torch.cat((before.to(packed.dtype), packed), dim=1)                 # (B, S + context, C)
    y = torch.stack([dw_bias + sum(x[:, u + j] * dw_weight[:, 0, j] for j in range(k1))
                     for u in range(s + k2 - 1)], dim=1)                     # (B, S + K2 - 1, C)
    group_in = g_weight.shape[1]
    out = torch.empty(b, s, c, dtype=packed.dtype)
    for o in range(c):
        g = o // group_in
        ins = y[..., g * group_in:(g + 1) * group_in]                        # (B, S + K2 - 1, in)
        out[..., o] = g_bias[o] + sum(ins[:, i:i + s] @ g_weight[o, :, i] for i in range(k2))
    return out


def inputs(left: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    b, s, c, group_in, k1, k2 = 2, 9, 12, 4, 2, 3
    tensors = [torch.randn(b, s, c, generator=gen, dtype=torch.float64),
               0.5 * torch.randn(c, 1, k1, generator=gen, dtype=torch.float64),
               0.1 * torch.randn(c, generator=gen, dtype=torch.float64),
               0.3 * torch.randn(c, group_in, k2, generator=gen, dtype=torch.float64),
               0.1 * torch.randn(c, generator=gen, dtype=torch.float64)]
    extra = torch.randn(b, c, k1 - 1 + k2 - 1, generator=gen, dtype=torch.float64) if left else None
    return tensors, extra


def outputs_and_grads(fn, tensors, left, grad, input_dtype=None, autocast=False):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    packed = leaves[0] if input_dtype is None else leaves[0].to(input_dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = fn(packed, *leaves[1:], left)
    out.backward(grad.to(out.dtype))
    return [out.detach()] + [t.grad for t in leaves]


@pytest.mark.parametrize("left", [False, True], ids=["from_zeros", "with_left_context"])
@pytest.mark.parametrize("mode", ["fp64", "fp32", "bf16_autocast"])
def test_cca_causal_conv_matches_the_taps(left, mode):
    """fp64 to 1e-12, fp32 to 1e-5, bf16 (autocast over fp32 weights and a bf16 input, as in training)
    within 2% of each tensor's norm; the output is (B, S, C) contiguous."""
    tensors, extra = inputs(left)
    grad = torch.randn(tensors[0].shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    want = outputs_and_grads(taps_conv, tensors, extra, grad)
    if mode != "fp64":    # fp32 weights (bf16 autocast: the model's fp32 parameters, cast by autocast)
        tensors, extra = [t.float() for t in tensors], None if extra is None else extra.float()
    got = outputs_and_grads(reference.cca_causal_conv, tensors, extra, grad,
                            input_dtype=torch.bfloat16 if mode == "bf16_autocast" else None,
                            autocast=mode == "bf16_autocast")
    assert got[0].shape == tensors[0].shape and got[0].is_contiguous()
    names = ["out", "d_packed", "d_dw_weight", "d_dw_bias", "d_g_weight", "d_g_bias"]
    for name, g, w in zip(names, got, want):
        error = ((g.double() - w).norm() / w.norm()).item()
        bound = {"fp64": 1e-12, "fp32": 1e-5, "bf16_autocast": 2e-2}[mode]
        assert error < bound, f"{name}: relative error {error:.2e} >= {bound}"


@pytest.mark.parametrize("left", [False, True])
def test_an_empty_sequence_gives_an_empty_output_and_zero_gradients(left):
    """No positions (S = 0), as the Triton kernel: an empty (B, 0, C) output, and every weight's (and the
    context's) gradient zero, not an error from the grouped conv's input being shorter than its kernel."""
    tensors, extra = inputs(left)
    tensors = [t.float().requires_grad_(True) for t in (tensors[0][:, :0].contiguous(), *tensors[1:])]
    extra = extra.float().requires_grad_(True) if left else None
    out = reference.cca_causal_conv(*tensors, extra)
    assert out.shape == (2, 0, 12)
    out.sum().backward()
    assert all(t.grad is not None and not t.grad.any() for t in (*tensors, *([extra] if left else [])))
