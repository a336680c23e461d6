"""Parameter placement under TP/EP, fit remedies, and errors that name the flag."""
import dataclasses

import pytest
import torch

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel
from megatron_zaya.planner import CLUSTERS, Efficiency, LayoutError, ParallelLayout, cluster_from_preset
from megatron_zaya.planner.memory import state_memory
from megatron_zaya.planner.plan import PlanOptions, fixes, make_plan

BASE = model_config_from_preset("zaya1-base")


def test_tp_and_ep_placement_of_weights():
    with torch.device("meta"):
        model = ZayaModel(BASE.replace(num_layers=2))
    config = BASE.replace(num_layers=2)
    split = {"attention": 0, "embedding": 0, "expert": 0, "router": 0, "other": 0}
    for name, p in model.named_parameters():
        kind = ("expert" if ".experts." in name else "router" if ".router." in name else
                "embedding" if name.startswith("embedding.") else "attention" if ".attention." in name else "other")
        split[kind] += p.numel()
    local = split["attention"] // 2 + split["embedding"] // 2 + split["expert"] // 8 + split["other"]
    layout = ParallelLayout(16, 4096, 1, 16, tensor_parallel=2, expert_parallel=4, zero1=True).validate(config)
    assert state_memory(config, layout).weights == 2 * local + 4 * split["router"]      # bf16, routers fp32
    plain = dataclasses.replace(layout, zero1=False)
    assert state_memory(config, plain).weights == 4 * (local + split["router"])          # fp32 without ZeRO-1


@pytest.mark.parametrize("tp", [2, 4])
def test_each_tp_rank_holds_what_the_planner_counts_with_more_ranks_than_kv_heads(tp):
    """TP 4 over 2 KV heads (ZAYA1-base's 2 at TP 4 or 8 are allowed, each rank holding a whole replicated KV
    head): the planner's parameters per rank are those of every rank of the trainer's TP-split model."""
    from megatron_zaya.parallel.apply import parallelize_model
    from megatron_zaya.parallel.state import ParallelState

    config = model_config_from_preset("zaya1-tiny", num_layers=2, vocab_size=512)
    assert config.num_query_groups == 2
    layout = ParallelLayout(tp, 256, 1, 1, tensor_parallel=tp).validate(config)
    planned = state_memory(config, layout).parameters
    for rank in range(tp):
        model = parallelize_model(ZayaModel(config), ParallelState(tp, world_size=tp, rank=rank, model_config=config))
        assert sum(p.numel() for p in model.parameters()) == planned, rank


def test_recompute_full_is_offered_to_a_layout_that_names_its_recompute_modules():
    """ZAYA1-base at 8K on one MI300X: "recompute full" fits, and is offered whether --recompute-modules was
    given (here the default list) or not (the candidate once kept the modules, an invalid layout)."""
    def offered(**kw):
        plan = make_plan(BASE, ParallelLayout(1, 8192, 1, 8, recompute="selective", **kw), CLUSTERS["mi300x"])
        assert not plan.fits
        return [d for d, fixed in fixes(plan) if d.startswith("recompute full") and fixed.fits]
    assert offered() and offered(recompute_modules=("layernorm", "core_attn", "moe_act"))


def test_smaller_micro_batch_is_offered_first_when_it_suffices():
    plan = make_plan(BASE, ParallelLayout(1024, 4096, 16, 16384, zero1=True), CLUSTERS["mi300x"])
    assert not plan.fits
    description, fixed = fixes(plan)[0]
    assert description.startswith("smaller micro batch") and fixed.fits
    # the largest micro batch that fits: twice it does not
    mbs = fixed.layout.micro_batch_size
    bigger = make_plan(BASE, ParallelLayout(1024, 4096, 2 * mbs, 16384, zero1=True), CLUSTERS["mi300x"])
    assert not bigger.fits


def test_recompute_and_cp_shrink_activations_in_order():
    def acts(**kw):
        return make_plan(BASE, ParallelLayout(8, 4096, 1, 8, zero1=True, **kw), CLUSTERS["h200"]).activations.stored
    none, selective, full = acts(), acts(recompute="selective"), acts(recompute="full")
    assert full < selective < none
    # CP=2: half the tokens, plus what CP adds (activations.py): the whole sequence's K/V and the halo's
    # second stacked projection weight: 53% at 4K.
    assert 0.5 < acts(context_parallel=2) / none < 0.6


@pytest.mark.parametrize("kwargs,flag", [
    (dict(tensor_parallel=3), "--gpus=1024"),
    (dict(tensor_parallel=16), "--tensor-model-parallel-size=16"),
    (dict(expert_parallel=3), "--expert-model-parallel-size=3"),
    (dict(global_batch_size=1000), "--global-batch-size=1000"),
    (dict(recompute="some"), "--recompute=some"),
])
def test_layout_errors_name_the_flag(kwargs, flag):
    args = dict(gpus=1024, seq_length=4096, micro_batch_size=1, global_batch_size=4096) | kwargs
    with pytest.raises(LayoutError, match=flag):
        ParallelLayout(**args).validate(BASE)


def test_option_errors_name_the_flag():
    with pytest.raises(ValueError, match="--cluster=tpu"):
        cluster_from_preset("tpu")
    with pytest.raises(ValueError, match="--inter-node-gbps=-1"):
        cluster_from_preset("h100", inter_node_gbps=-1)
    layout = ParallelLayout(8, 4096, 1, 8)
    with pytest.raises(ValueError, match="--compute-efficiency=1.5"):
        make_plan(BASE, layout, CLUSTERS["h100"], Efficiency(compute=1.5))
    with pytest.raises(ValueError, match="--optimizer=sgd"):
        make_plan(BASE, layout, CLUSTERS["h100"], options=PlanOptions(optimizer="sgd"))
    with pytest.raises(ValueError, match="--activation-policy=tpu"):
        make_plan(BASE, layout, CLUSTERS["h100"], options=PlanOptions(activation_policy="tpu"))


def test_moe_recompute_trades_compute_for_activations():
    """--recompute-modules moe: fewer activations than the cheap pieces alone, more than full; the
    router's and active expert's forward matmuls run twice, and so do the MoE's EP all-to-alls."""
    from megatron_zaya.model.accounting import matmul_macs_per_token

    def plan(**kw):
        return make_plan(BASE, ParallelLayout(8, 4096, 1, 8, zero1=True, expert_parallel=8, **kw), CLUSTERS["mi300x"])
    cheap, full = plan(recompute="selective"), plan(recompute="full")
    moe = plan(recompute="selective", recompute_modules=("layernorm", "core_attn", "moe_act", "moe"))
    assert full.activations.stored < moe.activations.stored < cheap.activations.stored
    macs = matmul_macs_per_token(BASE)
    extra = 2 * (macs["router"] + macs["active_expert"]) * 4096
    assert moe.time.executed_flops_per_gpu - cheap.time.executed_flops_per_gpu == pytest.approx(extra)
    assert moe.time.ep_comm == pytest.approx(cheap.time.ep_comm * 6 / 4)
    assert moe.layout.recompute_text == "selective (layernorm core_attn moe_act moe)"


def test_moe_recompute_is_offered_for_the_32k_phase_on_one_node():
    """ZAYA1-base at 32K on 8 MI300X without CP does not fit; recomputing the MoE sublayers is one remedy."""
    plan = make_plan(BASE, ParallelLayout(8, 32768, 1, 64, zero1=True), CLUSTERS["mi300x"])
    assert not plan.fits
    offered = {description: fixed for description, fixed in fixes(plan)}
    moe = [d for d in offered if "--recompute-modules layernorm core_attn moe_act moe" in d]
    assert moe and offered[moe[0]].fits and offered[moe[0]].layout.recomputes_moe


@pytest.mark.parametrize("kwargs,message", [
    (dict(recompute="full", recompute_modules=("moe",)), "--recompute-modules goes with --recompute selective"),
    (dict(recompute="selective", recompute_modules=("mlp",)), "--recompute-modules mlp: ZAYA1 blocks have no dense"),
])
def test_recompute_module_errors_name_the_flag(kwargs, message):
    with pytest.raises(LayoutError, match=message):
        ParallelLayout(8, 4096, 1, 8, **kwargs).validate(BASE)


def test_zero1_with_one_more_change_is_offered_when_no_single_change_fits():
    """Two 136 GB GPUs, micro batch 8: neither ZeRO-1 nor any one other change fits, ZeRO-1 with a micro
    batch of 1 does (with 2 it does not): that pair is the one remedy offered, and its plan is the plan of
    that layout."""
    cluster = cluster_from_preset("h100", memory_gb=136)
    layout = ParallelLayout(2, 4096, 8, 32)
    plan = make_plan(BASE, layout, cluster)
    assert not plan.fits and not layout.zero1

    def fits(**changes):
        import dataclasses
        return make_plan(BASE, dataclasses.replace(layout, **changes), cluster).fits

    singles = [dict(zero1=True), dict(micro_batch_size=4), dict(micro_batch_size=2), dict(micro_batch_size=1),
               dict(recompute="selective"), dict(recompute="full"), dict(context_parallel=2), dict(expert_parallel=2),
               dict(tensor_parallel=2, sequence_parallel=True)]
    assert not any(fits(**c) for c in singles)
    assert fits(zero1=True, micro_batch_size=1) and not fits(zero1=True, micro_batch_size=2)
    offered = fixes(plan)
    assert [d for d, _ in offered] == \
        ["enable ZeRO-1 and smaller micro batch (--use-distributed-optimizer --micro-batch-size 1)"]
    fixed = offered[0][1]
    assert fixed.fits and fixed.layout.zero1 and fixed.layout.micro_batch_size == 1
    assert fixed.memory_total == make_plan(BASE, ParallelLayout(2, 4096, 1, 32, zero1=True), cluster).memory_total