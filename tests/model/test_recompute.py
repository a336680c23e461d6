"""Full activation recomputation (ZayaModel.set_recompute): the same losses and gradients to the bit,
and fewer tensors kept from the forward for the backward."""
import pytest
import torch

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel


@pytest.fixture(scope="module")
def setup():
    config = model_config_from_preset("zaya1-tiny", num_layers=3, seq_length=32)
    torch.manual_seed(0)
    model = ZayaModel(config)
    tokens = torch.randint(0, config.vocab_size, (2, 32))
    labels = torch.randint(0, config.vocab_size, (2, 32))
    return model, tokens, labels


def step(model, tokens, labels):
    """(per-token losses, gradients, bytes of the tensors the forward keeps for the backward)."""
    kept = []

    def pack(t):
        kept.append(t.numel() * t.element_size())
        return t

    model.zero_grad()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(tokens, labels=labels)
    out.token_losses.mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.token_losses.detach(), grads, sum(kept)


@pytest.mark.parametrize("method, num_layers, units, kept_at_most", [
    ("uniform", 1, [(0, 1), (1, 2), (2, 3)], 0.5),
    ("uniform", 2, [(0, 2), (2, 3)], 0.5),
    ("block", 2, [(0, 1), (1, 2)], 0.75),        # the third block keeps its tensors
])
def test_recomputation_gives_the_same_gradients_and_keeps_less(setup, method, num_layers, units, kept_at_most):
    model, tokens, labels = setup
    model.set_recompute(None)
    losses, grads, kept = step(model, tokens, labels)
    model.set_recompute(method, num_layers)
    try:
        assert [(u.start, u.stop) for u in model.recompute_units] == units
        r_losses, r_grads, r_kept = step(model, tokens, labels)
    finally:
        model.set_recompute(None)
    assert torch.equal(losses, r_losses)
    assert grads.keys() == r_grads.keys()
    for name in grads:
        assert torch.equal(grads[name], r_grads[name]), name
    # The recomputed blocks' internals go: what is kept is their inputs, the rest, the head and the loss.
    assert r_kept < kept_at_most * kept, (r_kept, kept)


def test_no_recomputation_outside_training(setup):
    model, tokens, labels = setup
    model.set_recompute("uniform", 1)
    try:
        model.eval()
        with torch.no_grad():
            out = model(tokens, labels=labels)
        assert out.token_losses.shape == (2, 32)
    finally:
        model.train()
        model.set_recompute(None)
    with pytest.raises(ValueError, match="--recompute-method=sideways"):
        model.set_recompute("sideways", 1)
