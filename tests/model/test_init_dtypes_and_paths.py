"""What the whole-model comparisons cannot see: a fresh model's initial scales, biases and norm weights
(those tests load random values into every vector), the fp32 upcasts of bf16 activations (those tests
run fp32 or fp64), and which SDPA path attention takes (every path gives the same numbers)."""
import pytest
import torch

from megatron_zaya.checkpoint.hf_format import hf_config_dict, ours_to_hf_name
from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel, recompute
from megatron_zaya.model.cca import CompressedConvAttention, kv_for_sdpa
from megatron_zaya.model.norm import InputScaling, at_least_fp32
from megatron_zaya.model.router import ZayaRouter


def tiny_config(**overrides):
    base = dict(vocab_size=128, num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2,
                kv_channels=8, num_experts=3, moe_ffn_hidden_size=16, router_hidden_size=8, seq_length=16)
    return model_config_from_preset("zaya1-tiny", **{**base, **overrides})


# The vectors both initialise to constants (linear and convolution biases are random in both).
CONSTANT_INIT = ("norm.weight", "_scale", "_bias", "eda_gamma", "input_scaling.scale", "input_scaling.bias",
                 "balancing_bias")


def test_fresh_model_vectors_start_where_transformers_initialises_them():
    """Residual scales 1 and biases 0, norm weights 1, EDA gamma 1, input scaling (1, 0), skip bias -1 (spec
    and transformers' ZayaPreTrainedModel._init_weights); the key temperature is ours to choose."""
    transformers = pytest.importorskip("transformers")
    config = tiny_config()
    torch.manual_seed(0)
    ours = ZayaModel(config)
    hf_dict = hf_config_dict(config)
    theirs = transformers.ZayaForCausalLM(transformers.ZayaConfig(**{k: v for k, v in hf_dict.items()
                                                                      if k not in ("architectures", "model_type")}))
    reference = dict(theirs.state_dict())
    checked = 0
    for name, value in list(ours.named_parameters()) + list(ours.named_buffers()):
        if not name.endswith(CONSTANT_INIT):
            continue
        torch.testing.assert_close(value.detach().float(), reference[ours_to_hf_name(name)].float(), msg=name)
        checked += 1
        # and by hand, independently of transformers
        if name.endswith("balancing_bias"):
            assert value.tolist() == [0.0] * config.num_experts + [-1.0], name
        else:
            assert (value == (0 if name.endswith("bias") else 1)).all(), name
    assert checked == 2 * 13 - 1 + 3    # 13 a block (the first without EDA), then input scaling and final norm
    assert ours.layers[0].moe.router.eda_gamma is None and (ours.layers[1].moe.router.eda_gamma == 1).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_at_least_fp32_upcasts_low_precision_and_keeps_float64(dtype):
    x = torch.tensor([1.0, -2.5, 3.25], dtype=dtype)
    assert at_least_fp32(x).dtype == torch.float32
    assert at_least_fp32(x.double()).dtype == torch.float64
    scaling = InputScaling(3)
    with torch.no_grad():
        scaling.scale.copy_(torch.tensor([2.0, 0.5, -1.0]))
        scaling.bias.copy_(torch.tensor([1.0, 0.0, 0.25]))
    out = scaling(x)
    assert out.dtype == torch.float32          # the residual stream begins in fp32 from bf16 embeddings
    torch.testing.assert_close(out, torch.tensor([4.0, -1.25, -3.5]))   # (x + bias) * scale by hand


def test_router_of_bf16_activations_computes_in_fp32():
    """The router upcasts: bf16 activations route exactly as their (exact) fp32 values do."""
    torch.manual_seed(0)
    router = ZayaRouter(tiny_config(), use_eda=True)
    x, previous = torch.randn(2, 5, 32).bfloat16(), torch.randn(2, 5, 8)
    with torch.no_grad():
        routing, state = router(x, previous)
        exact, exact_state = router(x.float(), previous)
    assert state.dtype == routing.probs.dtype == routing.gate.dtype == torch.float32
    torch.testing.assert_close(routing.probs, exact.probs, rtol=0, atol=0)
    torch.testing.assert_close(state, exact_state, rtol=0, atol=0)


def test_force_balanced_routing_spreads_tokens_evenly_over_the_experts_and_skips_none():
    torch.manual_seed(0)
    config = tiny_config(num_experts=4)
    router = ZayaRouter(config, use_eda=False)
    router.force_balanced = True
    with torch.no_grad():
        routing, _ = router(torch.randn(2, 6, 32), None)
    assert routing.expert_index.tolist() == [i % 4 for i in range(12)]
    assert routing.counts.tolist() == [3, 3, 3, 3, 0]
    torch.testing.assert_close(routing.gate, routing.probs[torch.arange(12), routing.expert_index])


def _fake_backend(monkeypatch, math_when):
    """SDPA's choice as a GPU build makes it: math_when(grouped) says whether the math path is taken."""
    monkeypatch.setattr(recompute, "sdpa_keeps_scores", lambda q, k, v, mask, grouped: math_when(grouped))


@pytest.mark.parametrize("groups", [1, 2])
def test_kv_for_sdpa_leaves_kv_alone_where_a_fused_kernel_takes_them(monkeypatch, groups):
    _fake_backend(monkeypatch, lambda grouped: False)
    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 4 // groups, 5, 8), torch.randn(1, 4 // groups, 5, 8)
    got_k, got_v, gqa, math = kv_for_sdpa(q, k, v, None, groups)
    assert got_k is k and got_v is v and gqa == (groups > 1) and math is False


def test_kv_for_sdpa_repeats_grouped_heads_only_when_that_leaves_the_math_path(monkeypatch):
    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    # Grouped heads would take the math path, repeated ones a fused kernel: repeat (query head h reads KV h // 2).
    _fake_backend(monkeypatch, lambda grouped: grouped)
    got_k, got_v, gqa, math = kv_for_sdpa(q, k, v, None, 2)
    assert (gqa, math) == (False, False)
    torch.testing.assert_close(got_k, k[:, [0, 0, 1, 1]])
    torch.testing.assert_close(got_v, v[:, [0, 0, 1, 1]])
    # Math either way: no copies, and the caller is told the math path is taken.
    _fake_backend(monkeypatch, lambda grouped: True)
    got_k, got_v, gqa, math = kv_for_sdpa(q, k, v, None, 2)
    assert got_k is k and got_v is v and (gqa, math) == (True, True)
    # Ungrouped heads on the math path: nothing to repeat.
    k4 = torch.randn(1, 4, 5, 8)
    got_k, _, gqa, math = kv_for_sdpa(q, k4, k4, None, 1)
    assert got_k is k4 and (gqa, math) == (False, True)


@pytest.mark.parametrize("selective", [False, True])
def test_attention_core_is_recomputed_only_under_selective_recomputation(monkeypatch, selective):
    _fake_backend(monkeypatch, lambda grouped: True)       # SDPA takes its math path
    calls = []
    real = recompute.keep_inputs_only
    monkeypatch.setattr(recompute, "keep_inputs_only", lambda fn, *a: calls.append(fn) or real(fn, *a))
    torch.manual_seed(0)
    attention = CompressedConvAttention(tiny_config()).train()
    attention.recompute_selective = selective
    q = torch.randn(1, 6, 4, 8, requires_grad=True)
    k, v = torch.randn(1, 6, 2, 8), torch.randn(1, 6, 2, 8)
    out = attention.attend(q, k, v)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(2, 1), v.transpose(1, 2).repeat_interleave(2, 1),
        is_causal=True).transpose(1, 2).reshape(1, 6, 32)
    torch.testing.assert_close(out, want)
    assert len(calls) == (1 if selective else 0)
