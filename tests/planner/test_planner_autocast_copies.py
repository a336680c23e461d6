"""Without ZeRO-1 the trainer keeps fp32 weights, and bf16 autocast casts those the forward multiplies: the
planner's `autocast_copies` is what that adds to one micro-batch's saved tensors against bf16 weights (ZeRO-1's,
with which the activations are counted), measured on the model's own saved tensors: the bf16 weight copies
(experts, output projection, convolutions, the tied LM head; not the fp32 router's nor the stacked input
projections', a bf16 tensor either way) and the input scaling's embedding output, saved in fp32. A recomputed
unit keeps none in the forward: the planner adds the one unit being rerun in the backward."""
import pytest
import torch

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel
from megatron_zaya.planner.layout import ParallelLayout
from megatron_zaya.planner.memory import state_memory
from tests.saved_tensors import saved_storages

SEQ, BATCH = 32, 2


def saved_bytes(config, bf16_weights: bool, recompute=None, modules=None) -> int:
    """Bytes of the tensors one training forward under bf16 autocast saves for its backward (the weights'
    own storage left out), with fp32 weights or with ZeRO-1's bf16 ones (fp32 routers)."""
    torch.manual_seed(0)
    model = ZayaModel(config).train()
    if bf16_weights:
        model.store_weights_in(torch.bfloat16)
    if recompute:
        model.set_recompute(recompute, modules=modules)
    tokens = torch.randint(0, config.vocab_size, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(0))
    with saved_storages(model) as saved, torch.autocast("cpu", dtype=torch.bfloat16):
        model(tokens[:, :-1], labels=tokens[:, 1:])
    return sum(saved.values())


def fp32_extra(config, recompute=None, modules=None) -> int:
    return saved_bytes(config, False, recompute, modules) - saved_bytes(config, True, recompute, modules)


def planned(config, **layout) -> int:
    layout = ParallelLayout(1, SEQ, BATCH, BATCH, **layout).validate(config)
    return state_memory(config, layout).autocast_copies


@pytest.mark.parametrize("untied", [False, True])
def test_autocast_copies_are_what_fp32_weights_add_to_the_saved_tensors(untied):
    config = model_config_from_preset("zaya1-tiny", num_layers=2, vocab_size=512, seq_length=SEQ,
                                      untie_embeddings_and_output_weights=untied)
    measured = fp32_extra(config)
    assert measured > 1.8 * sum(p.numel() for p in ZayaModel(config).layers.parameters())    # nearly every weight
    assert planned(config) == measured
    # Selective recomputation keeps every copy too. (Measured without moe_act: its recompute.feed sets saved-tensor
    # hooks of its own around the down projection, which hide the copy that matmul keeps from the ones here.)
    light = ("layernorm", "core_attn")
    assert planned(config, recompute="selective") == fp32_extra(config, "selective", light) == measured
    assert planned(config, zero1=True) == 0


def test_a_recomputed_unit_keeps_its_copies_only_while_it_reruns():
    """Full recomputation: the forward keeps the head's copy alone; the planner adds one block's copies (the
    difference of a 2- and a 1-block model), live while that block reruns. The moe module: the forward keeps
    all but the experts' copies; the planner adds one block's experts."""
    config = model_config_from_preset("zaya1-tiny", num_layers=2, vocab_size=512, seq_length=SEQ)
    one_block = fp32_extra(config) - fp32_extra(config.replace(num_layers=1))
    assert planned(config, recompute="full") == fp32_extra(config, "full") + one_block
    experts = 2 * sum(p.numel() for p in ZayaModel(config).layers[0].moe.experts.parameters())
    modules = ("layernorm", "core_attn", "moe_act", "moe")
    assert planned(config, recompute="selective", recompute_modules=modules) == \
        fp32_extra(config, "selective", modules) + experts
