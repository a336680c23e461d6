"""reference.lm_head_cross_entropy (the LM head matmul and the blocked cross-entropy as one autograd function,
the loss gradient's row scale applied to the small operands) against a float64 F.cross_entropy(h @ W.T):
losses, d(hidden) and d(weight), with ignored labels and a per-row loss gradient (a masked mean's
1/count, and a random one); kernels.lm_head_cross_entropy under bf16 autocast against F.linear + the
reference cross_entropy.

Tolerances: fp32 loss 1e-5 absolute, gradients 1e-5 relative to their largest entry; bf16 inputs:
gradients 2^-6 relative to the largest entry (the logits' gradient rounded to bf16, then bf16 matmuls)."""
import pytest
import torch
import torch.nn.functional as F

from megatron_zaya import kernels
from megatron_zaya.kernels import reference as R


def inputs(dtype, n=300, d=48, v=1100, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=gen).to(dtype)
    weight = (torch.randn(v, d, generator=gen) / 3).to(dtype)
    labels = torch.randint(0, v, (n,), generator=gen)
    labels[::7] = R.IGNORE_INDEX
    return hidden, weight, labels


def losses_and_grads(fn, hidden, weight, labels, grad_loss):
    h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    loss = fn(h, w, labels)
    (loss * grad_loss.to(loss.dtype)).sum().backward()
    return loss.detach(), h.grad, w.grad


def float64_reference(h, w, labels):
    return F.cross_entropy(h.double() @ w.double().t(), labels, reduction="none", ignore_index=R.IGNORE_INDEX)


def max_relative(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


@pytest.mark.parametrize("dtype, loss_atol, grad_rtol", [(torch.float32, 1e-5, 1e-5), (torch.bfloat16, 1e-4, 2 ** -6)],
                         ids=["fp32", "bf16"])
@pytest.mark.parametrize("scale", ["masked-mean", "random"])
def test_matches_float64(dtype, loss_atol, grad_rtol, scale):
    hidden, weight, labels = inputs(dtype)
    valid = labels != R.IGNORE_INDEX
    grad_loss = valid.float() / valid.sum() if scale == "masked-mean" else torch.rand(labels.shape[0])
    got = losses_and_grads(R.lm_head_cross_entropy, hidden, weight, labels, grad_loss)
    want = losses_and_grads(float64_reference, hidden, weight, labels, grad_loss)
    # bf16: the loss is fp32 from the bf16 logits the matmul rounded; compare with float64 of those logits
    want_loss = want[0] if dtype == torch.float32 else F.cross_entropy(
        (hidden @ weight.t()).double(), labels, reduction="none", ignore_index=R.IGNORE_INDEX)
    assert (got[0].double() - want_loss).abs().max().item() < loss_atol
    assert (got[0][~valid] == 0).all()
    for g, w in zip(got[1:], want[1:]):
        assert g.dtype == dtype and max_relative(g, w) < grad_rtol


def test_second_backward_through_the_graph_is_exact():
    hidden, weight, labels = inputs(torch.float32)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss = R.lm_head_cross_entropy(h, w, labels).mean()
    first = torch.autograd.grad(loss, (h, w), retain_graph=True)
    second = torch.autograd.grad(loss, (h, w))
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_without_grad_gives_the_losses():
    hidden, weight, labels = inputs(torch.float32)
    with torch.no_grad():
        got = R.lm_head_cross_entropy(hidden, weight, labels)
    assert torch.allclose(got, R.cross_entropy(hidden @ weight.t(), labels), rtol=0, atol=1e-6)


def test_kernels_entry_under_bf16_autocast_matches_linear_then_cross_entropy():
    """fp32 hidden and weight (a parameter) under CPU bf16 autocast, as the model calls it: the same
    losses as F.linear + cross_entropy, and gradients (fp32, as autocast's casts return them) within bf16
    rounding."""
    hidden, weight, labels = inputs(torch.float32)
    grad_loss = torch.rand(labels.shape[0])

    def linear_then_ce(h, w, labels):
        return kernels.cross_entropy(F.linear(h, w), labels)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = losses_and_grads(kernels.lm_head_cross_entropy, hidden, weight, labels, grad_loss)
        want = losses_and_grads(linear_then_ce, hidden, weight, labels, grad_loss)
    assert torch.equal(got[0], want[0])
    for g, w in zip(got[1:], want[1:]):
        assert g.dtype == torch.float32 and max_relative(g, w) < 2 ** -7


def test_float64_inputs_stay_float64():
    """A float64 model (the whole-model reference check) gets float64 losses and gradients from both
    cross-entropies: gradcheck passes (cross_entropy, which allows one backward per graph: its gradient
    equals autograd's through F.cross_entropy), and the losses equal F.cross_entropy in float64 (they were
    rounded to fp32, 4e-7 off)."""
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(6, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    labels = torch.tensor([0, 3, R.IGNORE_INDEX, 10, 7, 1])
    assert torch.autograd.gradcheck(lambda h, w: R.lm_head_cross_entropy(h, w, labels), (hidden, weight))
    logits = (hidden @ weight.t()).detach().requires_grad_()
    upstream = torch.randn(6, dtype=torch.float64, generator=gen)
    ours, = torch.autograd.grad(R.cross_entropy(logits.clone(), labels), logits, upstream)
    theirs, = torch.autograd.grad(F.cross_entropy(logits, labels, reduction="none"), logits, upstream)
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-15)
    want = F.cross_entropy(logits, labels, reduction="none")
    for got in (R.lm_head_cross_entropy(hidden, weight, labels), R.cross_entropy(logits, labels)):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want, rtol=0, atol=1e-15)


def test_a_second_derivative_through_the_written_out_backwards_is_refused():
    """RMSNorm, QK-norm and both cross-entropies write their backward out from values saved in the forward,
    which a second differentiation would take as constants: it is an error, not silently wrong (the
    Hessian-vector products were off by the size of the result)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(5, 8, dtype=torch.float64, generator=gen)
    labels = torch.tensor([0, 4, 2])
    for name, f in (("rms_norm", lambda: R.rms_norm(x, weight[0], 1e-6)), ("qk_norm", lambda: R.qk_norm(x)),
                    ("cross_entropy", lambda: R.cross_entropy(x[:, :5] * 1.0, labels)),
                    ("lm_head_cross_entropy", lambda: R.lm_head_cross_entropy(x, weight, labels))):
        first, = torch.autograd.grad(f().sum(), x, create_graph=True)
        with pytest.raises(RuntimeError):
            torch.autograd.grad((first * first).sum(), x)


def test_triton_forced_on_cpu_tensors_outside_the_interpreter_is_a_clear_error(monkeypatch):
    """--kernels triton / MEGATRON_ZAYA_KERNELS=triton with CPU tensors: Triton runs them only in its
    interpreter; without TRITON_INTERPRET=1 the first op says so (it died deep in Triton: '0 active drivers')."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    previous = kernels.kernel_backend()
    kernels.set_kernel_backend("triton")
    try:
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            kernels.rms_norm(torch.randn(2, 8), torch.ones(8), 1e-6)
    finally:
        kernels.set_kernel_backend(previous)
