"""The global gradient norm that clipping uses and the log prints: sum_of_squares against float64 at sizes
where one fp32 reduction over the whole tensor drifts, and the single-process clip built on it."""
import pytest
import torch

from megatron_zaya.parallel.data import SQUARES_ROW, sum_of_squares
from megatron_zaya.training.runtime import SingleProcess


@pytest.mark.parametrize("numel", [0, 5, SQUARES_ROW, 3 * SQUARES_ROW + 1, 12_000_017])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_sum_of_squares_matches_float64(numel, dtype):
    """Within 1e-5 relative of float64 on the same (rounded) values (fp32 rows of 4096), a ragged tail
    included; fp32 out. One fp32 vector_norm over a 50M-element tensor was 4e-3 off on this CPU. (float64
    gradients, which GradientReducer accepts, raised: vector_norm cannot narrow them to fp32.)"""
    t = torch.randn(numel, generator=torch.Generator().manual_seed(numel)).to(dtype)
    want = t.double().square().sum()
    got = sum_of_squares(t.view(-1, 1) if numel else t)
    assert got.dtype == torch.float32
    assert abs(got.double() - want) <= 1e-5 * want + 1e-12


def test_sum_of_squares_passes_non_finite_values_through():
    assert torch.isinf(sum_of_squares(torch.tensor([1.0, float("inf")])))
    assert torch.isnan(sum_of_squares(torch.tensor([1.0, float("nan")])))


def test_single_process_clip_uses_the_accurate_norm():
    """A 12M-element gradient and a small one: the returned norm matches float64 to 1e-6, and clipping to
    max_norm leaves the gradients with that norm, the same direction (it used to leave them unscaled)."""
    model = torch.nn.Module()
    model.big = torch.nn.Parameter(torch.zeros(3000, 4001))
    model.small = torch.nn.Parameter(torch.zeros(7))
    gen = torch.Generator().manual_seed(0)
    model.big.grad = torch.randn(model.big.shape, generator=gen)
    model.small.grad = torch.randn(7, generator=gen)
    before = [p.grad.clone() for p in model.parameters()]
    want = torch.cat([g.double().view(-1) for g in before]).norm()
    runtime = SingleProcess(torch.device("cpu"))
    runtime.model = model
    norm = runtime.clip_grad_norm(1.0)
    assert abs(norm - float(want)) <= 1e-6 * float(want)
    after = torch.cat([p.grad.double().view(-1) for p in model.parameters()])
    assert float(after.norm()) == pytest.approx(1.0, rel=1e-5)
    torch.testing.assert_close(after, torch.cat([g.double().view(-1) for g in before]) / want, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_clip_leaves_non_finite_gradients_for_the_diagnosis(bad):
    """A non-finite norm scales nothing (the step is skipped and the non-finite gradients named); an
    infinite norm used to multiply every gradient by 0, turning the infinities into NaN."""
    model = torch.nn.Module()
    model.a = torch.nn.Parameter(torch.zeros(3))
    model.b = torch.nn.Parameter(torch.zeros(2))
    model.a.grad = torch.tensor([1.0, bad, 2.0])
    model.b.grad = torch.tensor([3.0, 4.0])
    runtime = SingleProcess(torch.device("cpu"))
    runtime.model = model
    norm = runtime.clip_grad_norm(1.0)
    assert not torch.isfinite(torch.tensor(norm))
    torch.testing.assert_close(model.a.grad, torch.tensor([1.0, bad, 2.0]), equal_nan=True)
    torch.testing.assert_close(model.b.grad, torch.tensor([3.0, 4.0]))
    assert runtime.count_zero_grads() == 0


def test_single_process_params_norm_matches_float64():
    """The params norm (--log-params-norm, TensorBoard's params-norm) of fp32 and bf16 weights, a 12M-element
    one among them, within 1e-6 of the float64 norm of the same values."""
    model = torch.nn.Module()
    gen = torch.Generator().manual_seed(1)
    model.big = torch.nn.Parameter(torch.randn(3000, 4001, generator=gen))
    model.bf16 = torch.nn.Parameter(torch.randn(513, 7, generator=gen).to(torch.bfloat16))
    model.small = torch.nn.Parameter(torch.randn(7, generator=gen) * 100)
    want = torch.cat([p.detach().double().view(-1) for p in model.parameters()]).norm().item()
    runtime = SingleProcess(torch.device("cpu"))
    runtime.model = model
    assert abs(runtime.params_norm() - want) <= 1e-6 * want
