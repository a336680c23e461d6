"""Which SDPA kernel the attention gets: grouped K/V heads go to SDPA as they are, unless only K/V repeated
to the query heads keep SDPA off its math path (CUDA: flash takes no explicit mask, the memory-efficient
kernel no grouped heads; some ROCm builds' flash no grouped heads). SDPA's own choice decides; on this CPU
the flash kernel takes both, so the repeat is exercised by making the choice say so (KERNELS: stand-ins for the
two GPU choices)."""
import pytest
import torch
from torch.nn.attention import SDPBackend
from torch.nn.attention.bias import CausalBias, causal_lower_right

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import recompute
from megatron_zaya.model.cca import CompressedConvAttention, kv_for_sdpa
from megatron_zaya.model.documents import additive_bias, document_attention_mask


def rocm_choice(q, k, v, mask, enable_gqa) -> bool:
    """A ROCm build whose flash kernel takes no grouped heads: the math path whenever they are grouped."""
    return enable_gqa


def cuda_choice(q, k, v, mask, enable_gqa) -> bool:
    """CUDA: flash takes grouped heads but no explicit mask (a causal call, or a CausalBias, which dispatches to
    flash itself), the memory-efficient kernel a mask but no grouped heads: the math path for a masked GQA call."""
    explicit = mask is not None and not isinstance(mask, CausalBias)
    return enable_gqa and explicit


KERNELS = {"rocm": rocm_choice, "cuda": cuda_choice}
REPEATS = {("rocm", False): True, ("rocm", True): True, ("cuda", False): False, ("cuda", True): True}


def qkv(dtype=torch.float32, s=24):
    torch.manual_seed(0)
    q = torch.randn(2, 8, s, 16, dtype=dtype)
    k, v = torch.randn(2, 2, s, 16, dtype=dtype), torch.randn(2, 2, s, 16, dtype=dtype)
    return q, k, v


def test_grouped_heads_stay_grouped_where_a_fused_kernel_takes_them():
    q, k, v = qkv(torch.bfloat16)
    ids = (torch.arange(24) // 7)[None].expand(2, 24)
    for mask in (None, additive_bias(document_attention_mask(ids, ids), torch.bfloat16)):
        k2, v2, gqa, _ = kv_for_sdpa(q, k, v, mask, 4)
        assert k2 is k and v2 is v and gqa


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("packed", [False, True], ids=["causal", "packed-documents"])
def test_repeated_heads_give_the_grouped_attention(monkeypatch, packed, kernels):
    """Where grouped heads would send SDPA to its math path (simulated), the heads are repeated: the same
    outputs and gradients, in float64, and the repeated call is the one a fused kernel takes. On CUDA that is
    packed documents' only (the choice is asked with the mask); a causal call stays grouped (flash)."""
    config = model_config_from_preset("zaya1-tiny", num_attention_heads=8, num_query_groups=2, kv_channels=16,
                                      hidden_size=64)
    attn = CompressedConvAttention(config).double()
    torch.manual_seed(1)
    q = torch.randn(2, 24, 8, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 24, 2, 16, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 24, 2, 16, dtype=torch.float64, requires_grad=True)
    ids = (torch.arange(24) // 7)[None].expand(2, 24)
    mask = document_attention_mask(ids, ids) if packed else None
    grouped = attn.attend(q, k, v, mask)
    expected = torch.autograd.grad(grouped.square().sum(), (q, k, v))
    asked = []

    def recording_choice(q_, k_, v_, mask_, enable_gqa):
        asked.append((k_.shape[1], enable_gqa))
        return KERNELS[kernels](q_, k_, v_, mask_, enable_gqa)
    monkeypatch.setattr(recompute, "sdpa_keeps_scores", recording_choice)
    repeated = attn.attend(q, k, v, mask)
    assert asked == ([(2, True), (8, False)] if REPEATS[kernels, packed] else [(2, True)])
    torch.testing.assert_close(repeated, grouped, rtol=0, atol=1e-12)
    for got, want in zip(torch.autograd.grad(repeated.square().sum(), (q, k, v)), expected):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    monkeypatch.setattr(recompute, "sdpa_keeps_scores", lambda *args: True)     # no fused kernel either way
    q_, k_, v_ = qkv()
    k2, v2, gqa, _ = kv_for_sdpa(q_, k_, v_, None, 4)
    assert k2 is k_ and v2 is v_ and gqa


def test_a_causal_bias_is_judged_without_materialising_it():
    """The CP chunks' lower-right causal bias: the choice for a one-row stand-in mask equals the choice for
    the materialised (Lq, Lk) mask CausalBias would hand SDPA."""
    q, k, v = qkv(torch.bfloat16, s=32)
    bias = causal_lower_right(8, 32)
    materialised = torch._fused_sdp_choice(q[:, :, :8], k, v, bias._materialize(q.device), 0.0, False, enable_gqa=True)
    assert recompute.sdpa_keeps_scores(q[:, :, :8], k, v, bias, True) == (materialised == SDPBackend.MATH.value)


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("packed", [False, True], ids=["causal", "packed-documents"])
def test_context_parallel_chunks_share_one_copy_of_repeated_kv(monkeypatch, packed, kernels):
    """The CP attention (parallel/context.py) on one rank holding both chunks (CP group of one): where grouped
    heads would send SDPA to its math path (simulated), K/V are repeated once, for the later chunk whose keys
    hold the earlier one's, and each chunk reads a prefix (repeating per chunk kept a copy for each: about
    1.3 GB per GPU at ZAYA1-base 32K CP 2 with packed documents, by the planner's count). Outputs and
    gradients equal the one-process attention's in float64. On CUDA only packed documents' chunk bias asks for
    the repeat; the causal chunks' CausalBias goes to flash grouped."""
    from types import SimpleNamespace

    from megatron_zaya.model.documents import PackedDocuments
    from megatron_zaya.model.rope import rope_cos_sin
    from megatron_zaya.parallel import context

    config = model_config_from_preset("zaya1-tiny", num_attention_heads=8, num_query_groups=2, kv_channels=16,
                                      hidden_size=64)
    attn = CompressedConvAttention(config).double()
    torch.manual_seed(2)
    x = torch.randn(2, 24, 64, dtype=torch.float64, requires_grad=True)
    cos, sin = (t.double() for t in rope_cos_sin(torch.arange(24)[None].expand(2, 24), config.rotary_dim, 1e4))
    ids = (torch.arange(24) // 7)[None].expand(2, 24)
    one_rank = SimpleNamespace(cp_rank=0, cp_size=1, cp_ranks=[0], cp_group=None)

    def run(cp: bool):
        documents = PackedDocuments(ids) if packed else None
        out = (context.context_parallel_attention(attn, x, cos, sin, one_rank, documents) if cp
               else attn(x, cos, sin, documents))
        return out, torch.autograd.grad(out.square().sum(), (x, *attn.parameters()))

    want, want_grads = run(cp=False)
    repeats = []
    real_kv_for_sdpa = context.kv_for_sdpa

    def counting_kv_for_sdpa(q, k, v, mask, groups):
        result = real_kv_for_sdpa(q, k, v, mask, groups)
        repeats.append(result[0] is not k)
        return result
    monkeypatch.setattr(context, "kv_for_sdpa", counting_kv_for_sdpa)
    monkeypatch.setattr(recompute, "sdpa_keeps_scores", KERNELS[kernels])
    got, got_grads = run(cp=True)
    assert repeats == [REPEATS[kernels, packed]]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
