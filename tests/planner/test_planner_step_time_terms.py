"""Each step-time term (planner/time.py) against its closed form, and the cluster presets against the data sheets.

The closed forms are written here from the model in time.py's docstring, not from its code: a ring all-reduce moves
2 (n-1)/n of the bytes through each rank's link, an all-gather or reduce-scatter (n-1)/n; the optimizer is
memory-bound on (grad + fp32 master r/w + state r/w + bf16 weight) bytes per local master element. Sizes come from
count_parameters (the real module on the meta device) and the config. All groups stay inside one node, the
efficiencies are 1.0, and the peak is made so large that compute and Newton-Schulz time vanish (< 1e-6 relative).
"""
import pytest

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model.accounting import count_parameters
from megatron_zaya.planner import CLUSTERS, PEAK_BF16_TFLOPS, Efficiency, ParallelLayout
from megatron_zaya.planner.hardware import ClusterSpec
from megatron_zaya.planner.time import step_time

CONFIG = model_config_from_preset("zaya1-tiny", num_layers=2)
FABRIC = 100e9                  # bytes/s, one direction, per GPU
HBM = 2e12                      # bytes/s
NODE = ClusterSpec("test", "test node", 8, 80, 1e9, HBM / 1e12, FABRIC / 1e9, 10)
EXACT = Efficiency(compute=1.0, hbm=1.0, intra_node=1.0, inter_node=1.0)


def test_tp_cp_ep_collectives_match_their_closed_forms():
    """TP=2, CP=2, EP=2 (DP=2) on one 8-GPU node, no recomputation, 3 micro-batches of 2 sequences of 256.
    Per layer and micro-batch: TP (sequence parallel) four all-reduces of the local tokens' D-vectors (bf16);
    CP an all-gather of K/V (2 x HKV/TP x dh bf16 values for every token of the sequence) forward and its
    reduce-scatter backward; EP four all-to-alls of the local tokens' D-vectors split over TP. Tolerance 1e-12."""
    tp = cp = ep = 2
    layers, micro_batches, mbs, seq = CONFIG.num_layers, 3, 2, 256
    layout = ParallelLayout(8, seq, mbs, mbs * 2 * micro_batches, tensor_parallel=tp, context_parallel=cp,
                            expert_parallel=ep).validate(CONFIG)
    assert layout.micro_batches == micro_batches
    t = step_time(CONFIG, layout, NODE, EXACT, overlap=False)
    local_tokens = mbs * seq // cp
    d, hkv, dh = CONFIG.hidden_size, CONFIG.num_query_groups, CONFIG.kv_channels
    all_reduce = 2 * (tp - 1) / tp * (local_tokens * d * 2) / FABRIC
    assert t.tp_comm == pytest.approx(layers * micro_batches * 4 * all_reduce, rel=1e-12)
    kv_of_the_sequence = mbs * seq * 2 * (hkv // tp) * dh * 2
    gather = (cp - 1) / cp * kv_of_the_sequence / FABRIC
    assert t.cp_comm == pytest.approx(layers * micro_batches * 2 * gather, rel=1e-12)
    all_to_all = (ep - 1) / ep * (local_tokens // tp * d * 2) / FABRIC
    assert t.ep_comm == pytest.approx(layers * micro_batches * 4 * all_to_all, rel=1e-12)


@pytest.mark.parametrize("optimizer,state_bytes", [("adamw", 16), ("muon", 8)])
def test_dp_all_reduce_and_optimizer_match_their_closed_forms(optimizer, state_bytes):
    """No ZeRO-1, TP=1, CP=2, EP=2 (DP=2) on 4 GPUs, fp32 gradients: the dense gradients are all-reduced over the
    DP x CP = 4 ranks, each rank's half of the experts over the 2 ranks holding them. The optimizer reads the
    fp32 grad (4), reads and writes the fp32 weight, its own master (8), and reads and writes the state (AdamW:
    two fp32 moments, 16; Muon: one momentum, 8) per local element; under ZeRO-1 it also writes the bf16 weight
    (2). Tolerance 1e-6 (Newton-Schulz time at the test's huge peak)."""
    layout = ParallelLayout(4, 256, 1, 4, context_parallel=2, expert_parallel=2).validate(CONFIG)
    t = step_time(CONFIG, layout, NODE, EXACT, optimizer=optimizer, grad_dtype="fp32", overlap=False)
    counts = count_parameters(CONFIG)
    dense, local_experts = counts.total - counts.expert, counts.expert // 2
    dp = 2 * 3 / 4 * 4 * dense / FABRIC + 2 * 1 / 2 * 4 * local_experts / FABRIC
    assert t.dp_comm == pytest.approx(dp, rel=1e-12) and t.dp_comm_exposed == pytest.approx(dp, rel=1e-12)
    per_element = 4 + 8 + state_bytes
    assert t.optimizer == pytest.approx((dense + local_experts) * per_element / HBM, rel=1e-6)
    # ZeRO-1 on one rank (the same elements): the bf16 weight written too
    one = ParallelLayout(1, 256, 1, 1, zero1=True).validate(CONFIG)
    zero1 = step_time(CONFIG, one, NODE, EXACT, optimizer=optimizer, grad_dtype="fp32", overlap=False)
    assert zero1.optimizer == pytest.approx(counts.total * (per_element + 2) / HBM, rel=1e-6)


# name: (HBM GB, HBM TB/s, fabric GB/s one direction = aggregate / 2, NIC GB/s = Gb/s / 8), from the
# data sheets quoted in planner/hardware.py's docstring.
DATA_SHEETS = {
    "mi300x": (192, 5.3, 896 / 2, 400 / 8),
    "mi325x": (256, 6.0, 896 / 2, 400 / 8),
    "mi355x": (288, 8.0, 1075 / 2, 400 / 8),
    "h100": (80, 3.35, 900 / 2, 400 / 8),
    "h200": (141, 4.8, 900 / 2, 400 / 8),
    "a100": (80, 2.04, 600 / 2, 200 / 8),
}


def test_cluster_presets_match_the_data_sheets():
    """Every CLUSTERS preset against the vendors' numbers (exact: they are typed in, not computed)."""
    assert sorted(CLUSTERS) == sorted(DATA_SHEETS)
    for name, (memory, hbm, fabric, nic) in DATA_SHEETS.items():
        spec = CLUSTERS[name]
        got = (spec.gpus_per_node, spec.memory_gb, spec.peak_bf16_tflops, spec.hbm_tbps, spec.intra_node_gbps,
               spec.inter_node_gbps)
        assert got == (8, memory, PEAK_BF16_TFLOPS[name], hbm, fabric, nic), name
        assert spec.memory_bytes == memory * 2 ** 30


def test_a_full_mesh_node_gives_a_group_one_link_per_other_member():
    """On a node with point-to-point links and no switch (AMD's Infinity Fabric: 7 links per GPU), a TP pair
    crosses one link: its all-reduces take 7x what the whole fabric would give them, a group of 4 crosses 3
    (the pair was charged the whole fabric, 7x too fast, ranking TP=2 far cheaper than TP=8)."""
    mesh = ClusterSpec("mesh", "mesh node", 8, 80, 1e9, HBM / 1e12, FABRIC / 1e9, 10, intra_node_links=7)
    times = {}
    for tp in (2, 4):
        layout = ParallelLayout(8, 256, 2, 2 * 8 // tp, tensor_parallel=tp).validate(CONFIG)
        times[tp] = step_time(CONFIG, layout, mesh, EXACT, overlap=False).tp_comm
        switched = step_time(CONFIG, layout, NODE, EXACT, overlap=False).tp_comm
        assert times[tp] == pytest.approx(switched * 7 / (tp - 1), rel=1e-12), tp
    # the same bytes per pass over (n-1)/n of them: a pair's all-reduce through one link of FABRIC / 7
    all_reduce = 2 * (1 / 2) * (2 * 256 * CONFIG.hidden_size * 2) / (FABRIC / 7)
    assert times[2] == pytest.approx(CONFIG.num_layers * 4 * all_reduce, rel=1e-12)
    assert all(CLUSTERS[name].intra_node_links == (7 if name.startswith("mi") else 0) for name in CLUSTERS)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0])
def test_a_cluster_value_that_is_not_a_positive_finite_number_is_refused(value):
    from megatron_zaya.planner.hardware import cluster_from_preset
    with pytest.raises(ValueError, match=r"--peak-tflops=.*: must be a positive finite number"):
        cluster_from_preset("mi300x", peak_bf16_tflops=value)
