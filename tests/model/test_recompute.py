"""Activation recomputation (ZayaModel.set_recompute), full and selective: the same losses and gradients
to the bit, and fewer tensors kept from the forward for the backward."""
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel
from tests.saved_tensors import saved_storages


@pytest.fixture(scope="module")
def setup():
    config = model_config_from_preset("zaya1-tiny", num_layers=3, seq_length=32)
    torch.manual_seed(0)
    model = ZayaModel(config)
    tokens = torch.randint(0, config.vocab_size, (2, 32))
    labels = torch.randint(0, config.vocab_size, (2, 32))
    return model, tokens, labels


def step(model, tokens, labels, bf16=False):
    """(per-token losses, gradients, bytes of the tensors the forward keeps for the backward: each storage
    once, parameters left out)."""
    model.zero_grad()
    with saved_storages(model) as kept:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(tokens, labels=labels)
    out.token_losses.mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.token_losses.detach(), grads, sum(kept.values())


def assert_identical(run, other):
    losses, grads, _ = run
    other_losses, other_grads, _ = other
    assert torch.equal(losses, other_losses)
    assert grads.keys() == other_grads.keys()
    for name in grads:
        assert torch.equal(grads[name], other_grads[name]), name


@pytest.mark.parametrize("method, num_layers, units, kept_at_most", [
    ("uniform", 1, [(0, 1), (1, 2), (2, 3)], 0.5),
    ("uniform", 2, [(0, 2), (2, 3)], 0.5),
    ("block", 2, [(0, 1), (1, 2)], 0.75),        # the third block keeps its tensors
])
def test_recomputation_gives_the_same_gradients_and_keeps_less(setup, method, num_layers, units, kept_at_most):
    model, tokens, labels = setup
    model.set_recompute(None)
    plain = step(model, tokens, labels)
    model.set_recompute("full", method, num_layers)
    try:
        assert [(u.start, u.stop) for u in model.recompute_units] == units
        recomputed = step(model, tokens, labels)
    finally:
        model.set_recompute(None)
    assert_identical(plain, recomputed)
    # The recomputed blocks' internals go: what is kept is their inputs, the rest, the head and the loss.
    assert recomputed[2] < kept_at_most * plain[2], (recomputed[2], plain[2])


def test_no_recomputation_outside_training(setup):
    model, tokens, labels = setup
    model.set_recompute("full", "uniform", 1)
    try:
        model.eval()
        with torch.no_grad():
            out = model(tokens, labels=labels)
        assert out.token_losses.shape == (2, 32)
    finally:
        model.train()
        model.set_recompute(None)
    with pytest.raises(ValueError, match="--recompute-method=sideways"):
        model.set_recompute("full", "sideways", 1)


# Kept bytes of the 3-layer fixture, fp32 / bf16 autocast, none -> selective (measured): SDPA math path
# 5.28 -> 4.64 MB / 7.97 -> 6.53 MB (S x S probabilities included), flash 5.09 -> 4.64 MB / 7.68 -> 6.53 MB;
# full: 2.32 / 3.35 MB (the norms keep only their inputs and rstd: "layernorm" drops nothing).
# tests/planner/test_planner_activations.py checks the selective bytes term by term.
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("backend", [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION], ids=["sdpa-math", "sdpa-flash"])
def test_selective_recomputation_gives_the_same_gradients_and_keeps_less(setup, backend, bf16):
    """Selective recomputation (QK-norm + RoPE, router GELU and expert SwiGLU outputs, and the attention
    core where SDPA's math path keeps the S x S probabilities): bit-identical losses and gradients, at least
    a twentieth fewer bytes kept, and more than full recomputation keeps."""
    model, tokens, labels = setup
    with sdpa_kernel(backend):
        model.set_recompute(None)
        plain = step(model, tokens, labels, bf16)
        model.set_recompute("full")
        full = step(model, tokens, labels, bf16)
        model.set_recompute("selective")
        try:
            assert model.recompute_units == [] and model.recompute_granularity == "selective"
            selective = step(model, tokens, labels, bf16)
        finally:
            model.set_recompute(None)
    assert_identical(plain, selective)
    assert full[2] < selective[2] < 0.95 * plain[2], (full[2], selective[2], plain[2])


def test_selective_recomputation_policy(setup):
    """The policy reaches every module that holds a recomputed piece, is cleared by None, and takes no
    --recompute-method / --recompute-num-layers (Megatron's rule)."""
    model, _, _ = setup
    flagged = [m for m in model.modules() if getattr(m, "recompute_selective", False)]
    assert flagged == []
    model.set_recompute("selective")
    try:
        flagged = {type(m).__name__ for m in model.modules() if getattr(m, "recompute_selective", False)}
        assert flagged == {"CompressedConvAttention", "ZayaRouter", "GroupedExperts"}   # the norms: nothing to drop
        assert model.recompute_modules == ("layernorm", "core_attn", "moe_act")
        model.set_recompute("selective", modules=["moe", "core_attn"])
        flagged = {type(m).__name__ for m in model.modules() if getattr(m, "recompute_selective", False)}
        assert flagged == {"MoELayer", "CompressedConvAttention"}
        model.set_recompute("selective", modules=["moe_act", "moe"])     # moe_act is inside the rerun sublayer
        flagged = {type(m).__name__ for m in model.modules() if getattr(m, "recompute_selective", False)}
        assert flagged == {"MoELayer"}
        for name, reason in [("mlp", "no dense MLP"), ("shared_experts", "no shared experts"),
                             ("mla_up_proj", "no MLA"), ("attention", "choose among layernorm, core_attn")]:
            with pytest.raises(ValueError, match=f"--recompute-modules {name}: .*{reason}"):
                model.set_recompute("selective", modules=[name])
        with pytest.raises(ValueError, match="--recompute-modules goes with --recompute-granularity selective"):
            model.set_recompute("full", modules=["moe"])
        with pytest.raises(ValueError, match="--recompute-method and --recompute-num-layers go with"):
            model.set_recompute("selective", "uniform", 1)
        with pytest.raises(ValueError, match="--recompute-granularity=partial"):
            model.set_recompute("partial")
    finally:
        model.set_recompute(None)
    assert not any(getattr(m, "recompute_selective", False) for m in model.modules())


# Kept bytes of the 3-layer fixture, fp32, SDPA math path (measured): none 5.28 MB, the three cheap modules 4.64 MB;
# moe 4.16, core_attn 5.08, layernorm + moe_act 4.84, moe + layernorm + core_attn 3.96 MB.
@pytest.mark.parametrize("modules", [["moe"], ["core_attn"], ["layernorm", "moe_act"], ["moe", "layernorm", "core_attn"]])
def test_recompute_modules_give_the_same_gradients(setup, modules):
    """--recompute-modules (Megatron's names) chooses the pieces: any choice leaves losses and gradients
    bit-identical; each keeps less than no recomputation, and "moe" (the whole MoE sublayer rerun in the
    backward, the only piece whose matmuls run twice) less than the three cheap pieces together."""
    model, tokens, labels = setup
    with sdpa_kernel(SDPBackend.MATH):
        model.set_recompute(None)
        plain = step(model, tokens, labels)
        model.set_recompute("selective")
        cheap = step(model, tokens, labels)
        model.set_recompute("selective", modules=modules)
        try:
            chosen = step(model, tokens, labels)
        finally:
            model.set_recompute(None)
    assert_identical(plain, chosen)
    assert chosen[2] < plain[2], (chosen[2], plain[2])
    if "moe" in modules:
        assert chosen[2] < cheap[2], (chosen[2], cheap[2])


def test_moe_act_inside_a_rerun_moe_sublayer_keeps_nothing(setup, monkeypatch):
    """--recompute-modules moe_act moe (what --moe-layer-recompute adds to the default): the rerun sublayer keeps
    only its inputs. moe_act's own saved-tensor hooks took the router's and experts' tensors from the rerun's
    checkpoint and kept them alive (+50% kept per token on zaya1-tiny); the same gradients either way."""
    import gc
    import weakref

    from megatron_zaya.model.recompute import _Recomputed
    made, real_init = [], _Recomputed.__init__
    monkeypatch.setattr(_Recomputed, "__init__", lambda self, *args: made.append(weakref.ref(self)) or
                        real_init(self, *args))
    model, tokens, labels = setup
    with sdpa_kernel(SDPBackend.MATH):
        model.set_recompute(None)
        plain = step(model, tokens, labels)
        model.set_recompute("selective", modules=["moe_act", "moe"])
        try:
            out = model(tokens, labels=labels)
            gc.collect()
            alive = sum(ref() is not None for ref in made)
            del out
            both = step(model, tokens, labels)
        finally:
            model.set_recompute(None)
    assert alive == 0
    assert_identical(plain, both)
