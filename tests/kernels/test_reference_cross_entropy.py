"""The CPU reference cross-entropy (kernels/reference.py, _BlockedCrossEntropy) against a float64
F.cross_entropy: loss and gradient, fp32 and bf16 logits, ignored labels, both backward paths (a
per-row loss gradient exact in bf16, and one that is not), logits overwritten or kept.

Tolerances: fp32 loss 1e-5, gradient 1e-6 absolute; bf16 logits: loss as fp32 (the loss is computed
in fp32 from the bf16 values), gradient relative 2^-7 (the unscaled part rounded to bf16 in the
forward, then the product: two roundings)."""
import pytest
import torch
import torch.nn.functional as F

from megatron_zaya.kernels import reference as R


def float64_reference(logits, labels, grad_loss):
    x = logits.detach().double().requires_grad_()
    loss = F.cross_entropy(x, labels, reduction="none", ignore_index=R.IGNORE_INDEX)
    (loss * grad_loss.double()).sum().backward()
    return loss, x.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("exact_scale", [True, False])
@pytest.mark.parametrize("overwrite", [False, True])
def test_matches_float64(dtype, exact_scale, overwrite):
    gen = torch.Generator().manual_seed(0)
    n, v = 300, 1100        # several row blocks (2^18 logits each), the last one ragged
    logits = (3 * torch.randn(n, v, generator=gen)).to(dtype)
    labels = torch.randint(0, v, (n,), generator=gen)
    labels[::7] = R.IGNORE_INDEX
    grad_loss = torch.full((n,), 1 / 256) if exact_scale else torch.rand(n, generator=gen)
    want_loss, want_grad = float64_reference(logits, labels, grad_loss)

    leaf = logits.clone().requires_grad_()
    inner = leaf * 1                          # a non-leaf the function may overwrite
    loss = R.cross_entropy(inner, labels, overwrite_logits=overwrite)
    (loss * grad_loss).sum().backward()

    torch.testing.assert_close(loss.double(), want_loss, rtol=0, atol=1e-5)
    assert (loss[labels == R.IGNORE_INDEX] == 0).all()
    got = leaf.grad.double()
    if dtype == torch.float32:
        torch.testing.assert_close(got, want_grad, rtol=0, atol=1e-6)
    else:
        assert ((got - want_grad).abs() <= 2 ** -7 * want_grad.abs() + 1e-30).all()
    assert (got[labels == R.IGNORE_INDEX] == 0).all()
    # The gradient is built in the logits' memory only when the caller allows it.
    assert torch.equal(inner.detach(), logits) != overwrite


def test_no_grad_leaves_logits_untouched():
    logits = torch.randn(20, 50)
    labels = torch.randint(0, 50, (20,))
    kept = logits.clone().requires_grad_()
    with torch.no_grad():                     # evaluation: no gradient wanted, so nothing is written
        loss = R.cross_entropy(kept, labels, overwrite_logits=True)
    again = R.cross_entropy(logits.clone(), labels, overwrite_logits=True)   # no input needs a gradient
    assert torch.equal(kept.detach(), logits)
    torch.testing.assert_close(loss, F.cross_entropy(logits, labels, reduction="none"))
    assert torch.equal(loss, again)


def test_second_backward_is_an_error():
    logits = torch.randn(8, 30, requires_grad=True)
    loss = R.cross_entropy(logits, torch.randint(0, 30, (8,))).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="retain_graph"):
        loss.backward()
