"""Packed documents (--reset-attention-mask with --reset-position-ids): every document of a packed
sequence gets the logits and gradients it gets alone, in float64. CCA's convolutions and value
shift read the steps before a token, so they restart at document starts as the attention does
(kernels.reference.cca_causal_conv_segmented, checked here against the plain convolution). The batch
carries document ids; the model builds the mask from them once per forward (model/documents.py)."""
import pytest
import torch

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.data.gpt_dataset import SampleOptions, gpt_sample
from megatron_zaya.kernels.reference import cca_causal_conv, cca_causal_conv_segmented
from megatron_zaya.model import ZayaModel
from megatron_zaya.model.cca import CompressedConvAttention, LeftContext, lag_visibility
from megatron_zaya.model.documents import PackedDocuments, document_attention_mask, lag_visibility_of_ids
from tests.saved_tensors import saved_storages

EOD = 0


def packed_inputs(documents: list[torch.Tensor]):
    """tokens, position_ids and document ids the data pipeline makes for the documents packed into
    one sample (each ending with EOD), as the model receives them."""
    text = torch.cat([torch.cat((d, torch.tensor([EOD]))) for d in documents] + [torch.tensor([EOD])]).numpy()
    sample = gpt_sample(text, SampleOptions(len(text) - 1, EOD, EOD, True, True, False))
    return (torch.from_numpy(sample["tokens"])[None], torch.from_numpy(sample["position_ids"])[None],
            torch.from_numpy(sample["document_ids"])[None])


@pytest.mark.parametrize("kernels", [(2, 2), (3, 2), (2, 4)])
def test_segmented_convolution_restarts_at_every_document(kernels):
    torch.manual_seed(0)
    k1, k2 = kernels
    b, s, c, groups = 2, 13, 12, 3
    x = torch.randn(b, s, c, dtype=torch.float64)
    dw, db = torch.randn(c, 1, k1, dtype=torch.float64), torch.randn(c, dtype=torch.float64)
    gw, gb = torch.randn(c, c // groups, k2, dtype=torch.float64), torch.randn(c, dtype=torch.float64)
    lags = k1 - 1 + k2 - 1
    causal = torch.tril(torch.ones(s, s, dtype=torch.bool))
    whole = cca_causal_conv_segmented(x, dw, db, gw, gb, lag_visibility(causal[None, None], lags).expand(b, s, lags))
    torch.testing.assert_close(whole, cca_causal_conv(x, dw, db, gw, gb), rtol=0, atol=1e-12)
    # every lag marked visible, even before the start: still the plain conv (steps before the start are the
    # zero padding's depthwise bias; the grouped taps read 0 there)
    every = torch.ones(b, s, lags, dtype=torch.bool)
    torch.testing.assert_close(cca_causal_conv_segmented(x, dw, db, gw, gb, every), cca_causal_conv(x, dw, db, gw, gb),
                               rtol=0, atol=1e-12)
    doc = torch.tensor([0] * 4 + [1] * 1 + [2] * 8)          # a one-step document included
    mask = causal & (doc[:, None] == doc[None, :])
    out = cca_causal_conv_segmented(x, dw, db, gw, gb, lag_visibility(mask[None, None], lags).expand(b, s, lags))
    for d in range(3):
        rows = (doc == d).nonzero().squeeze(1)
        alone = cca_causal_conv(x[:, rows], dw, db, gw, gb)
        torch.testing.assert_close(out[:, rows], alone, rtol=0, atol=1e-12)


@pytest.mark.parametrize("heads, kernels", [((4, 2), (2, 2)), ((4, 1), (2, 2)), ((4, 2), (1, 1)), ((4, 2), (1, 3))])
def test_each_packed_document_gets_what_it_gets_alone(heads, kernels):
    """Kernels of 1 and 1: no convolution reads back, the value shift still does (that mask had no lags)."""
    torch.manual_seed(0)
    config = model_config_from_preset("zaya1-tiny", vocab_size=256, num_layers=3, num_attention_heads=heads[0],
                                      num_query_groups=heads[1], cca_depthwise_kernel=kernels[0],
                                      cca_grouped_kernel=kernels[1])
    model = ZayaModel(config).double()
    documents = [torch.randint(1, 256, (n,)) for n in (6, 1, 9)]
    tokens, positions, ids = packed_inputs(documents)
    out = model(tokens, position_ids=positions, document_ids=ids)
    # The same as the dense mask the ids stand for (Megatron's form, built once per forward here).
    mask = document_attention_mask(ids, ids)
    torch.testing.assert_close(model(tokens, position_ids=positions, attention_mask=mask).logits, out.logits,
                               rtol=0, atol=0)
    start = 0
    for doc in documents:
        alone = model(torch.cat((doc, torch.tensor([EOD])))[None])
        torch.testing.assert_close(out.logits[:, start:start + len(doc) + 1], alone.logits, rtol=0, atol=1e-10)
        start += len(doc) + 1
    # gradients: the packed sample's loss over the documents = the sum of their separate losses
    labels = torch.roll(tokens, -1, dims=1)
    n = sum(len(d) + 1 for d in documents)
    model(tokens[:, :n], labels[:, :n], positions[:, :n], document_ids=ids[:, :n]).token_losses.sum().backward()
    packed_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    start = 0
    for doc in documents:
        end = start + len(doc) + 1
        model(tokens[:, start:end], labels[:, start:end]).token_losses.sum().backward()
        start = end
    separate = dict(model.named_parameters())
    assert len(packed_grads) > 20
    for name, grad in packed_grads.items():
        torch.testing.assert_close(grad, separate[name].grad, rtol=1e-9, atol=1e-10, msg=name)


def test_a_non_boolean_mask_is_refused():
    with pytest.raises(ValueError, match="attention_mask must be boolean"):
        lag_visibility(torch.zeros(1, 1, 4, 4), 2)


def test_document_ids_give_the_masks_visibility():
    """lag_visibility_of_ids equals lag_visibility of the dense mask the ids stand for; both are built once
    per forward and shared by the layers (PackedDocuments' cache)."""
    ids = torch.tensor([[0, 0, 0, 1, 2, 2, 2, 2], [0, 1, 1, 1, 1, 1, 3, 3]])
    docs = PackedDocuments(ids)
    for lags in (1, 2, 4, 9):       # more lags than steps: those columns are all False
        assert torch.equal(docs.visibility(lags), lag_visibility(document_attention_mask(ids, ids), lags))
    one = torch.ones(2, 1, 1, 1, dtype=torch.bool)                           # a one-step sequence's mask
    assert torch.equal(lag_visibility(one, 2), torch.zeros(2, 1, 2, dtype=torch.bool))
    assert docs.attention_mask() is docs.attention_mask()
    with pytest.raises(ValueError, match="document_ids must be"):
        PackedDocuments(ids.float())


@pytest.mark.parametrize("start, kernels", [(3, (2, 2)), (5, (2, 2)), (8, (2, 2)), (4, (1, 1)), (5, (1, 1)),
                                            (5, (3, 1))])
def test_a_left_context_with_documents_continues_the_convolution(start, kernels):
    """What context parallelism does at a chunk boundary: the steps after `start`, given the `lookback`
    steps before it as a LeftContext with their visibility (left_context_from_hidden, as the CP halo makes
    it), get what the whole packed sequence gives them (convolutions and value shift), whether or not a
    document starts near the boundary; with kernels of 1 and 1 the value shift's one step."""
    from megatron_zaya.parallel.context import left_context_from_hidden

    torch.manual_seed(0)
    config = model_config_from_preset("zaya1-tiny", num_attention_heads=4, num_query_groups=2, kv_channels=16,
                                      hidden_size=64, cca_depthwise_kernel=kernels[0], cca_grouped_kernel=kernels[1])
    attn = CompressedConvAttention(config).double()
    ids = torch.tensor([[0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 3]])
    x = torch.randn(1, ids.shape[1], 64, dtype=torch.float64)
    width = attn.lookback
    visible = lag_visibility_of_ids(ids, width)
    q, k, v, _, _ = attn.project(x, visible=visible)
    left = left_context_from_hidden(attn, x[:, start - width:start], visible[:, start - width:start])
    q2, k2, v2, _, _ = attn.project(x[:, start:], left, visible[:, start:])
    for whole, part in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(part, whole[:, start:], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="needs the left steps' visibility"):
        attn.project(x[:, start:], LeftContext(left.conv_inputs, left.delayed_value), visible[:, start:])


def test_the_document_mask_is_kept_once_for_every_layer():
    """SDPA turns a boolean mask into an additive bias in every call, and with the flash kernel each layer's
    backward keeps its own copy. From document ids the model builds that bias once per forward: with 3
    layers, 2 fewer (B, 1, S, S) fp32 biases are kept than with the dense mask."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    model = ZayaModel(model_config_from_preset("zaya1-tiny", num_layers=3, vocab_size=256))
    b, s = 2, 128
    tokens = torch.randint(1, 256, (b, s))
    ids = (torch.arange(s) // 40)[None].expand(b, s).contiguous()

    def kept(**inputs) -> int:
        with saved_storages(model) as storages, sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            model(tokens, labels=tokens, **inputs)
        return sum(storages.values())
    dense = kept(attention_mask=document_attention_mask(ids, ids))
    assert dense - kept(document_ids=ids) == 2 * b * s * s * 4


def test_selective_recomputation_of_the_segmented_convolution_is_exact():
    """Under --recompute-granularity selective (core_attn) the segmented conv keeps only its inputs and runs
    again in the backward: the same losses and gradients to the bit as without recomputation."""
    torch.manual_seed(0)
    model = ZayaModel(model_config_from_preset("zaya1-tiny", num_layers=2, vocab_size=256))
    tokens = torch.randint(1, 256, (2, 64))
    ids = (torch.arange(64) // 20)[None].expand(2, 64).contiguous()
    results = []
    for granularity in (None, "selective"):
        model.set_recompute(granularity)
        model.zero_grad()
        losses = model(tokens, labels=tokens.roll(-1, 1), document_ids=ids).token_losses
        losses.mean().backward()
        results.append((losses.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    model.set_recompute(None)
    (plain, plain_grads), (recomputed, recomputed_grads) = results
    assert torch.equal(plain, recomputed)
    for name, grad in plain_grads.items():
        assert torch.equal(grad, recomputed_grads[name]), name
