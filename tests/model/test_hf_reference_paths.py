"""Our model against transformers' ZayaForCausalLM beyond the forward logits of test_hf_reference.py:
every parameter's gradient, other CCA conv kernel sizes, a position offset, packed documents (each document
against transformers on that document alone) and cached decoding (against transformers' own cache). fp32,
eager attention; the tolerances are those of the logits test (differences seen: 1e-5 and below)."""
import pytest
import torch

from megatron_zaya.checkpoint.hf_format import ours_to_hf_name, save_hf_folder
from megatron_zaya.inference.cache import InferenceCache
from megatron_zaya.inference.decode import forward_with_cache
from tests.model.test_hf_reference import randomized_model

transformers = pytest.importorskip("transformers")

BASE = dict(num_layers=3, hidden_size=64, num_attention_heads=8, num_query_groups=2, kv_channels=16)
TOKENS = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(1))


def pair(tmp_path, **overrides):
    model = randomized_model({**BASE, **overrides}, seed=3).eval()
    save_hf_folder(model.state_dict(), model.config, tmp_path / "hf")
    reference = transformers.ZayaForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    return model, reference


def largest_difference(a, b) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("depthwise,grouped", [(3, 2), (1, 1), (4, 1)])
def test_other_conv_kernel_sizes_match(tmp_path, depthwise, grouped):
    model, reference = pair(tmp_path, cca_depthwise_kernel=depthwise, cca_grouped_kernel=grouped)
    with torch.no_grad():
        assert largest_difference(model(TOKENS).logits, reference(TOKENS).logits) <= 1e-4


def test_every_parameter_gradient_matches(tmp_path):
    model, reference = pair(tmp_path)
    weights = torch.randn(2, 33, 256, generator=torch.Generator().manual_seed(5))
    (model(TOKENS).logits * weights).sum().backward()
    (reference(TOKENS).logits * weights).sum().backward()
    theirs = dict(reference.named_parameters())
    compared = 0
    for name, param in model.named_parameters():
        other = theirs[ours_to_hf_name(name)]
        assert param.grad is not None and other.grad is not None, name
        scale = other.grad.abs().max().clamp_min(1e-12)
        assert largest_difference(param.grad, other.grad) / scale <= 1e-4, name
        compared += 1
    assert compared == len(theirs)      # every transformers parameter has its counterpart (tied head: one)


def test_packed_documents_and_a_position_offset_match_each_document_alone(tmp_path):
    model, reference = pair(tmp_path)
    offset = (torch.arange(33) + 100).expand(2, 33)
    with torch.no_grad():
        assert largest_difference(model(TOKENS, position_ids=offset).logits,
                                  reference(TOKENS, position_ids=offset).logits) <= 1e-4
        starts = [12, 5]          # document 1 of each row starts there
        document_ids = torch.stack([(torch.arange(33) >= s).long() for s in starts])
        positions = torch.stack([torch.cat((torch.arange(s), torch.arange(33 - s))) for s in starts])
        packed = model(TOKENS, document_ids=document_ids, position_ids=positions).logits
        for row, start in enumerate(starts):
            for piece in (slice(0, start), slice(start, 33)):
                alone = reference(TOKENS[row:row + 1, piece]).logits[0]
                assert largest_difference(packed[row, piece], alone) <= 1e-4, (row, piece)


def test_cached_decoding_matches_transformers_cache(tmp_path):
    """Prefill 10 tokens, then one at a time to 20, with our compressed CCA cache and with transformers'."""
    model, reference = pair(tmp_path)
    with torch.no_grad():
        cache = InferenceCache(model.config, 2, 64)
        ours = [forward_with_cache(model, cache, TOKENS[:, :10], all_logits=True)]
        out = reference(TOKENS[:, :10], use_cache=True)
        theirs = [out.logits]
        for t in range(10, 20):
            ours.append(forward_with_cache(model, cache, TOKENS[:, t:t + 1], all_logits=True))
            past = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
            out = reference(TOKENS[:, t:t + 1], cache=past, use_cache=True)
            theirs.append(out.logits)
        assert largest_difference(torch.cat(ours, 1), torch.cat(theirs, 1)) <= 1e-4
        assert largest_difference(torch.cat(ours, 1), reference(TOKENS[:, :20]).logits) <= 1e-4
