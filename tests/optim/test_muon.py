"""Muon against an independent float64, one-matrix-at-a-time implementation of the same update."""
import math

import pytest
import torch

from megatron_zaya.optim.muon import Muon, MuonScale

# Keller Jordan's published Muon quintic (github.com/KellerJordan/Muon), written out here rather than imported
# from the module under test so that a typo there fails the comparisons below.
PUBLISHED_NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def reference_newton_schulz(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    a, b, c = PUBLISHED_NS_COEFFICIENTS
    x = g.double()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def reference_scale(out: int, inp: int, mode: str, extra: float) -> float:
    """Megatron-LM's --muon-scale-mode factors of an (out, in) matrix, times the extra factor."""
    if mode == "spectral":
        return extra * max(out, inp) ** 0.5
    if mode == "unit_rms_norm":
        return extra * (out / inp) ** 0.5
    return extra * max(1.0, out / inp) ** 0.5        # shape_scaling


def reference_step(param, grad, buffer, lr, momentum, weight_decay, mode="spectral", extra=0.2):
    """One Muon step on a single matrix in float64; returns (new param, new buffer)."""
    buffer = momentum * buffer + grad
    direction = grad + momentum * buffer
    update = reference_newton_schulz(direction) * reference_scale(*param.shape, mode, extra)
    return param * (1 - lr * weight_decay) - lr * update, buffer


@pytest.mark.parametrize("mode, extra", [("spectral", 0.2), ("unit_rms_norm", 1.0), ("shape_scaling", 0.5)])
def test_muon_matches_float64_reference_per_matrix(mode, extra):
    """The default (spectral x 0.2: ZAYA1's AdamW RMS matching) and Megatron-LM's other scale modes."""
    torch.manual_seed(0)
    shapes = [(16, 24), (24, 16), (16, 24), (3, 10, 12)]   # same-shape pair batched; a 3-expert tensor
    params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    scale = MuonScale(mode, extra)
    opt = Muon(params, lr=0.05, momentum=0.9, weight_decay=0.1, ns_dtype=torch.float32,
               **({} if (mode, extra) == ("spectral", 0.2) else {"scale": scale}))
    ref_params = [p.detach().double().clone() for p in params]
    ref_buffers = [torch.zeros_like(p) for p in ref_params]
    for _ in range(3):
        grads = [torch.randn(s) for s in shapes]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        for i, g in enumerate(grads):
            p, buf = ref_params[i], ref_buffers[i]
            if p.ndim == 2:
                ref_params[i], ref_buffers[i] = reference_step(p, g.double(), buf, 0.05, 0.9, 0.1, mode, extra)
            else:   # each expert is its own matrix
                pairs = [reference_step(p[e], g[e].double(), buf[e], 0.05, 0.9, 0.1, mode, extra)
                         for e in range(p.shape[0])]
                ref_params[i] = torch.stack([x for x, _ in pairs])
                ref_buffers[i] = torch.stack([y for _, y in pairs])
    for p, ref in zip(params, ref_params):
        torch.testing.assert_close(p.detach().double(), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(32, 64), (64, 32), (16, 48)])
def test_newton_schulz_orthogonalises(shape):
    """Five steps of the published quintic leave the singular values of a Gaussian matrix in the band it is
    tuned for, about [0.68, 1.12] (asserted: [0.6, 1.2]); the kernel's fp32 iteration equals the test's
    float64 one (published coefficients) to 1e-5."""
    from megatron_zaya.kernels import reference

    torch.manual_seed(1)
    g = torch.randn(shape)
    want = reference_newton_schulz(g)
    got = reference.newton_schulz(g[None], steps=5, dtype=torch.float32)[0]
    assert (got.double() - want).abs().max() < 1e-5
    for x in (want, got.double()):
        singular = torch.linalg.svdvals(x)
        assert singular.min() > 0.6 and singular.max() < 1.2, singular


def test_bf16_newton_schulz_is_close_to_float64():
    """Muon's bf16 Newton-Schulz (the default on GPUs and on CPUs with native bf16) against the
    float64 reference, on the update itself (lr 1, no decay, zero weights: weights after one step =
    -update). bf16 keeps 8 mantissa bits and five iterations compound the rounding: measured
    1.4-1.6% relative (Frobenius) error on these shapes with the baddbmm form (2.8-3.4% with
    separate matmuls, scalings and adds), so the stated tolerance is 3% relative and a cosine above
    0.9995 with the exact update."""
    torch.manual_seed(2)
    for shape in [(16, 24), (24, 16), (64, 128), (3, 32, 48)]:
        p = torch.nn.Parameter(torch.zeros(shape))
        opt = Muon([p], lr=1.0, momentum=0.9, weight_decay=0.0, ns_dtype=torch.bfloat16)
        grad = torch.randn(shape)
        p.grad = grad.clone()
        opt.step()
        direction = (grad * 1.9).double()          # Nesterov on a zero buffer: g + 0.9 * g
        matrices = direction if direction.ndim == 3 else direction[None]
        ref = torch.stack([reference_newton_schulz(m) for m in matrices]).reshape(shape)
        ref = ref * 0.2 * math.sqrt(max(shape[-2:]))
        got = -p.detach().double()
        assert (got - ref).norm() / ref.norm() < 0.03, shape
        assert torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0) > 0.9995, shape


def test_an_empty_matrix_slice_gets_no_update_and_others_are_unchanged():
    """Under TP with fewer KV heads than ranks a rank's V-projection slice is (0, D); Newton-Schulz
    must skip it (it used to fail to reshape 0 elements) and leave the other matrices' updates as is."""
    torch.manual_seed(0)
    full = [torch.nn.Parameter(torch.randn(8, 16)), torch.nn.Parameter(torch.randn(16, 8))]
    with_empty = [torch.nn.Parameter(p.detach().clone()) for p in full] + [torch.nn.Parameter(torch.zeros(0, 16))]
    grads = [torch.randn_like(p) for p in full]
    for params in (full, with_empty):
        for p, g in zip(params, grads + [torch.zeros(0, 16)]):
            p.grad = g.clone()
        Muon(params, lr=0.02, ns_dtype=torch.float32).step()
    assert all(torch.equal(a, b) for a, b in zip(full, with_empty)) and with_empty[2].shape == (0, 16)


def test_muon_scale_flags_reach_the_optimizer_and_bad_values_are_refused(tmp_path):
    from megatron_zaya.arguments import parse_args
    from megatron_zaya.model import ZayaModel
    from megatron_zaya.optim.builder import build_optimizer
    run = parse_args(["--mock-data", "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "100",
                      "--train-iters", "1", "--num-layers", "1", "--muon-scale-mode", "unit_rms_norm",
                      "--muon-extra-scale-factor", "1.0", "--muon-use-nesterov"])
    optimizers = build_optimizer(ZayaModel(run.model), run.optim)
    assert optimizers.optimizers["muon"].scale == MuonScale("unit_rms_norm", 1.0)
    assert build_optimizer(ZayaModel(run.model), parse_args(["--mock-data", "--tokenizer-type", "NullTokenizer",
                                                             "--tokenizer-model", "100", "--train-iters", "1",
                                                             "--num-layers", "1"]).optim
                           ).optimizers["muon"].scale == MuonScale("spectral", 0.2)
    with pytest.raises(ValueError, match="--muon-scale-mode bogus"):
        MuonScale("bogus")
    with pytest.raises(SystemExit):
        parse_args(["--mock-data", "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "100",
                    "--train-iters", "1", "--muon-extra-scale-factor", "0"])


@pytest.mark.parametrize("transposed", [False, True], ids=["wide", "tall"])
def test_cpu_chunked_newton_schulz_equals_the_whole_stack(monkeypatch, transposed):
    """On CPU a stack runs NEWTON_SCHULZ_CPU_CHUNK_BYTES of X at a time: 7 matrices in chunks of 2 (the last
    one alone) give each matrix's float64 result (fp32: 1e-5) and the whole stack's within fp32 rounding."""
    from megatron_zaya.kernels import reference

    torch.manual_seed(3)
    grads = torch.randn(7, 12, 20)
    if transposed:
        grads = grads.transpose(-2, -1).contiguous()
    monkeypatch.setattr(reference, "NEWTON_SCHULZ_CPU_CHUNK_BYTES", 0)
    whole = reference.newton_schulz(grads, dtype=torch.float32)
    monkeypatch.setattr(reference, "NEWTON_SCHULZ_CPU_CHUNK_BYTES", 2 * 12 * 20 * 4)
    chunked = reference.newton_schulz(grads, dtype=torch.float32)
    assert chunked.shape == grads.shape and chunked.dtype == torch.float32
    ref = torch.stack([reference_newton_schulz(g) for g in grads])
    assert (chunked.double() - ref).abs().max() < 1e-5
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("steps", [0, 1, 5])
@pytest.mark.parametrize("rows, cols", [(12, 20), (20, 12)], ids=["wide", "tall"])
def test_newton_schulz_folds_the_scale_and_keeps_the_layout(steps, rows, cols):
    """reference.newton_schulz(scale=s) is s x the float64 iteration of each matrix (tall ones taken from the
    right, the test's reference transposes them), to 1e-5 in fp32; bf16 within 3% of the float64 norm;
    the result is contiguous in the input's layout (Muon adds it to the parameter as it is)."""
    from megatron_zaya.kernels import reference

    torch.manual_seed(5)
    grads = torch.randn(3, rows, cols)
    scale = 0.2 * max(rows, cols) ** 0.5
    want = torch.stack([reference_newton_schulz(g, steps) for g in grads]) * scale
    got = reference.newton_schulz(grads, steps=steps, dtype=torch.float32, scale=scale)
    assert got.shape == grads.shape and got.is_contiguous()
    assert (got.double() - want).abs().max() < 1e-5 * scale
    got_bf16 = reference.newton_schulz(grads.bfloat16(), steps=steps, scale=scale)
    assert got_bf16.dtype == torch.bfloat16
    assert (got_bf16.double() - want).norm() < 0.03 * want.norm()
