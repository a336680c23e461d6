"""Packed documents (--reset-attention-mask with --reset-position-ids): every document of a packed
sequence gets the logits and gradients it gets alone, in float64. CCA's convolutions and value
shift read the steps before a token, so they restart at document starts as the attention does
(kernels.reference.cca_causal_conv_segmented, checked here against the plain convolution)."""
import pytest
import torch

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.data.gpt_dataset import SampleOptions, gpt_sample
from megatron_zaya.kernels.reference import cca_causal_conv, cca_causal_conv_segmented
from megatron_zaya.model import ZayaModel
from megatron_zaya.model.cca import lag_visibility

EOD = 0


def packed_inputs(documents: list[torch.Tensor]):
    """tokens, position_ids and the (1, 1, S, S) attention mask (True = attend) the data pipeline
    makes for the documents packed into one sample (each ending with EOD), as the model receives them."""
    text = torch.cat([torch.cat((d, torch.tensor([EOD]))) for d in documents] + [torch.tensor([EOD])]).numpy()
    sample = gpt_sample(text, SampleOptions(len(text) - 1, EOD, EOD, True, True, False))
    return (torch.from_numpy(sample["tokens"])[None], torch.from_numpy(sample["position_ids"])[None],
            ~torch.from_numpy(sample["attention_mask"])[None])


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
    doc = torch.tensor([0] * 4 + [1] * 1 + [2] * 8)          # a one-step document included
    mask = causal & (doc[:, None] == doc[None, :])
    out = cca_causal_conv_segmented(x, dw, db, gw, gb, lag_visibility(mask[None, None], lags).expand(b, s, lags))
    for d in range(3):
        rows = (doc == d).nonzero().squeeze(1)
        alone = cca_causal_conv(x[:, rows], dw, db, gw, gb)
        torch.testing.assert_close(out[:, rows], alone, rtol=0, atol=1e-12)


@pytest.mark.parametrize("heads", [(4, 2), (4, 1)])
def test_each_packed_document_gets_what_it_gets_alone(heads):
    torch.manual_seed(0)
    config = model_config_from_preset("zaya1-tiny", vocab_size=256, num_layers=3, num_attention_heads=heads[0],
                                      num_query_groups=heads[1])
    model = ZayaModel(config).double()
    documents = [torch.randint(1, 256, (n,)) for n in (6, 1, 9)]
    tokens, positions, mask = packed_inputs(documents)
    out = model(tokens, position_ids=positions, attention_mask=mask)
    start = 0
    for doc in documents:
        alone = model(torch.cat((doc, torch.tensor([EOD])))[None])
        torch.testing.assert_close(out.logits[:, start:start + len(doc) + 1], alone.logits, rtol=0, atol=1e-10)
        start += len(doc) + 1
    # gradients: the packed sample's loss over the documents = the sum of their separate losses
    labels = torch.roll(tokens, -1, dims=1)
    n = sum(len(d) + 1 for d in documents)
    model(tokens[:, :n], labels[:, :n], positions[:, :n], mask[..., :n, :n]).token_losses.sum().backward()
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
