"""WeightCasts: one bf16 copy of the experts' and LM head's weights per step, shared by its micro-batches,
gives the same losses and fp32 gradients, bit for bit, as casting in every micro-batch."""
import pytest
import torch

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel
from megatron_zaya.model.weight_casts import WeightCasts


def accumulate(model, batches, cache: bool):
    """Forward + backward of each micro-batch under bf16 autocast; (losses, gradients by name)."""
    model.zero_grad(set_to_none=True)
    losses, kept = [], []
    with model.weight_casts.caching(cache):
        for tokens in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(tokens, labels=tokens.roll(-1, dims=1))
            loss = out.token_losses.mean()
            loss.backward()
            losses.append(loss.detach())
            kept.append(model.weight_casts.kept)
    # Caching: two expert weights per block and the LM head, made by the first micro-batch, then reused.
    assert kept == ([2 * len(model.layers) + 1] * len(batches) if cache else [0] * len(batches))
    return losses, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("recompute", [None, "selective", "full"])
def test_kept_copies_give_the_same_gradients(recompute):
    torch.manual_seed(0)
    config = model_config_from_preset("zaya1-tiny", num_layers=2, vocab_size=512)
    model = ZayaModel(config)
    if recompute:
        model.set_recompute(recompute)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, config.vocab_size, (2, 32), generator=gen) for _ in range(3)]
    losses, grads = accumulate(model, batches, cache=False)
    cached_losses, cached_grads = accumulate(model, batches, cache=True)
    assert grads.keys() == cached_grads.keys() and len(grads) == len(list(model.parameters()))
    for a, b in zip(losses, cached_losses):
        assert torch.equal(a, b)
    for name in grads:
        assert torch.equal(grads[name], cached_grads[name]), name
    assert not model.weight_casts.caching_now       # the copies are gone after the loop


def test_a_copy_is_reused_only_while_its_weight_and_grad_mode_are_unchanged():
    casts = WeightCasts()
    weight = torch.randn(4, 3, requires_grad=True)
    assert casts(weight, torch.float32) is weight
    assert casts(weight, torch.bfloat16) is not casts(weight, torch.bfloat16)    # not caching: fresh casts
    with casts.caching():
        first = casts(weight, torch.bfloat16)
        assert casts(weight, torch.bfloat16) is first and first.grad_fn is not None
        with torch.no_grad():
            plain = casts(weight, torch.bfloat16)
            assert plain is not first and plain.grad_fn is None
            weight.mul_(2.0)                   # an in-place change: the kept copy is stale
        again = casts(weight, torch.bfloat16)
        assert again is not first and torch.equal(again, (2 * first).detach())
        (first.float().sum() + again.float().sum()).backward()
        assert torch.equal(weight.grad, torch.full_like(weight, 2.0))   # both copies pass gradients back
    assert not casts.caching_now
    with casts.caching(enabled=False):
        assert not casts.caching_now
