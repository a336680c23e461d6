"""Step time of a training layout: compute, optimizer, communication, and what overlaps.

Compute: the model's training FLOPs (model/accounting.py: forward x 3, one expert per token, causal
attention) for the tokens one GPU processes, divided by peak x Efficiency.compute. Full recomputation
adds one forward of the blocks; selective recomputation only elementwise work (not counted), unless its
modules include "moe", which adds the router's and the active expert's forward matmuls and runs the MoE
sublayer's EP all-to-alls and TP reduction once more.

Communication, with ring costs (a ring all-reduce moves 2 (n-1)/n of the bytes through each rank's
link, a reduce-scatter or all-gather (n-1)/n) at the bus bandwidth of the slowest link the group
crosses: the GPU fabric inside a node, the NIC across nodes (each times its efficiency). Ranks are
ordered TP fastest, then CP, then DP, so TP and CP groups stay inside a node when they fit; EP groups
are made of consecutive DP x CP ranks. `hierarchical=True` models a two-level collective instead:
the node-local part at fabric speed, then the 1/local share across nodes at NIC speed.
* data parallel, once per step: ZeRO-1 reduce-scatters the gradients (grad dtype) and all-gathers the
  updated weights (bf16); without ZeRO-1 one all-reduce of the gradients. Dense gradients over
  DP x CP ranks, expert gradients over the expert-DP group;
* context parallel, per layer and micro-batch: all-gather of K/V (2 HKV dh bf16 values per token) in
  the forward, reduce-scatter of their gradients in the backward (the conv/value halo is negligible);
* expert parallel, per layer and micro-batch: four all-to-alls (dispatch and combine, forward and
  backward) of the local tokens' D-vectors in bf16;
* tensor parallel (sequence parallel), per layer and micro-batch: four all-reduce volumes of the
  local tokens' D-vectors (all-gather + reduce-scatter around each sublayer, forward and backward).
Overlap (Megatron's --overlap-grad-reduce / --overlap-param-gather): the gradient reduction hides
behind the backward of the last micro-batch and the weight all-gather behind the forward of the first;
only the rest is exposed. TP, CP and EP communication is counted as exposed (on the critical path).
Optimizer: memory-bound, bytes moved per local master element at HBM x Efficiency.hbm; Muon adds
Newton-Schulz (5 quintic steps) FLOPs: under ZeRO-1 those of the matrices the busiest rank owns (whole
matrices, DistributedMuon's owners: at many ranks more than 1/N of them), replicated otherwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from megatron_zaya.config import ModelConfig
from megatron_zaya.model.accounting import forward_flops_per_token, matmul_macs_per_token, training_flops_per_token
from megatron_zaya.planner.hardware import ClusterSpec, Efficiency
from megatron_zaya.planner.layout import ParallelLayout, tp_rank_config
from megatron_zaya.planner.memory import muon_owner_loads, parameter_inventory, parameter_shapes


@dataclass
class StepTime:
    compute: float                # forward + backward (+ recompute) of all micro-batches
    optimizer: float
    dp_comm: float                # data-parallel collectives, total
    dp_comm_exposed: float
    cp_comm: float                # per step, exposed
    ep_comm: float
    tp_comm: float
    model_flops_per_gpu: float    # without recomputation (MFU convention)
    executed_flops_per_gpu: float

    @property
    def total(self) -> float:
        return self.compute + self.optimizer + self.dp_comm_exposed + self.cp_comm + self.ep_comm + self.tp_comm


def _bus_bandwidth(cluster: ClusterSpec, eff: Efficiency, size: int, stride: int) -> float:
    if size * stride > cluster.gpus_per_node:
        return cluster.inter_node_gbps * 1e9 * eff.inter_node
    return cluster.intra_node_gbps * 1e9 * eff.intra_node * cluster.fabric_fraction(size)


def ring_time(nbytes: float, size: int, stride: int, cluster: ClusterSpec, eff: Efficiency,
              passes: float = 1.0, hierarchical: bool = False) -> float:
    """Time of `passes` reduce-scatter/all-gather-sized ring passes over `nbytes` (all-reduce: passes=2)."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    spans_nodes = size * stride > cluster.gpus_per_node
    if hierarchical and spans_nodes:
        local = max(1, min(size, cluster.gpus_per_node // stride))
        nodes = size / local
        intra = cluster.intra_node_gbps * 1e9 * eff.intra_node * cluster.fabric_fraction(local)
        inter = cluster.inter_node_gbps * 1e9 * eff.inter_node
        t = (local - 1) / local * nbytes / intra + (nodes - 1) / nodes * (nbytes / local) / inter
        return passes * t
    return passes * (size - 1) / size * nbytes / _bus_bandwidth(cluster, eff, size, stride)


def newton_schulz_flops(rows: int, cols: int, steps: int = 5) -> float:
    m, n = min(rows, cols), max(rows, cols)
    return steps * (4 * m * m * n + 2 * m ** 3)


def step_time(config: ModelConfig, layout: ParallelLayout, cluster: ClusterSpec, eff: Efficiency,
              optimizer: str = "adamw", grad_dtype: str = "fp32", overlap: bool = True,
              hierarchical: bool = False) -> StepTime:
    s, tp, cp, ep = layout.seq_length, layout.tensor_parallel, layout.context_parallel, layout.expert_parallel
    # Every GPU does an equal share of the work (a TP group splits its tokens' work TP ways).
    tokens_per_gpu = layout.global_batch_size * s / layout.gpus
    model_flops = training_flops_per_token(config, s) * tokens_per_gpu
    # What a rank runs: with TP > KV heads, its replicated KV head's work too (not model FLOPs).
    rank_config = tp_rank_config(config, tp)
    executed = training_flops_per_token(rank_config, s) * tokens_per_gpu
    if layout.recompute == "full":
        lm_head = 2 * matmul_macs_per_token(rank_config)["lm_head"]
        executed += (forward_flops_per_token(rank_config, s) - lm_head) * tokens_per_gpu
    elif layout.recomputes_moe:        # the router and the active expert's matmuls run twice
        macs = matmul_macs_per_token(rank_config)
        executed += 2 * (macs["router"] + macs["active_expert"]) * tokens_per_gpu
    compute = executed / (cluster.peak_flops * eff.compute)
    per_micro_batch = compute / layout.micro_batches
    fwd_first, bwd_last = per_micro_batch / 3, per_micro_batch * 2 / 3

    # Optimizer: bytes moved per local master element (grad read, master r/w, state r/w, and under ZeRO-1 the
    # bf16 weight write; without it the fp32 weights are the masters).
    params = parameter_inventory(rank_config, tp, ep)
    grad_b = 4 if grad_dtype == "fp32" else 2
    dense = [p for p in params if not p.expert]
    experts = [p for p in params if p.expert]
    dense_n, expert_n = sum(p.numel for p in dense), sum(p.numel for p in experts)
    shard_dense = layout.dense_shard_group if layout.zero1 else 1
    shard_expert = layout.expert_data_parallel if layout.zero1 else 1
    local_master = dense_n / shard_dense + expert_n / shard_expert
    state_rw = 8 if optimizer == "muon" else 16
    opt_bytes = local_master * (grad_b + 8 + state_rw + (2 if layout.zero1 else 0))
    optimizer_time = opt_bytes / (cluster.hbm_tbps * 1e12 * eff.hbm)
    if optimizer == "muon":
        # Newton-Schulz on whole matrices (a TP group orthogonalises them whole), of this rank's experts.
        ns_flops = {}
        for name, shape in parameter_shapes(config):
            rows, cols = shape[-2:] if len(shape) >= 2 else (0, 0)
            count = math.prod(shape) // max(1, rows * cols) // (ep if ".moe.experts." in name else 1)
            ns_flops[name] = count * newton_schulz_flops(rows, cols) if rows else 0.0
        load = lambda p: ns_flops[p.name]   # noqa: E731
        if layout.zero1:     # each rank its own matrices (whole, on owners): the busiest rank's share
            ns = max(muon_owner_loads(params, layout, load))
        else:
            ns = sum(load(p) for p in params if p.muon)
        optimizer_time += ns / (cluster.peak_flops * eff.compute)

    # Data-parallel gradient reduction and weight gather, once per step.
    dense_group, expert_group = layout.dense_shard_group, layout.expert_data_parallel
    dense_grad = sum(p.numel * (4 if grad_dtype == "fp32" else p.storage_bytes) for p in dense)
    expert_grad = sum(p.numel * (4 if grad_dtype == "fp32" else p.storage_bytes) for p in experts)
    dense_w, expert_w = sum(p.numel * p.storage_bytes for p in dense), sum(p.numel * p.storage_bytes for p in experts)
    args = dict(cluster=cluster, eff=eff, hierarchical=hierarchical)
    if layout.zero1:
        reduce = (ring_time(dense_grad, dense_group, tp, **args) + ring_time(expert_grad, expert_group, tp * ep, **args))
        gather = (ring_time(dense_w, dense_group, tp, **args) + ring_time(expert_w, expert_group, tp * ep, **args))
    else:
        reduce = (ring_time(dense_grad, dense_group, tp, passes=2, **args)
                  + ring_time(expert_grad, expert_group, tp * ep, passes=2, **args))
        gather = 0.0
    if overlap:
        exposed = max(0.0, reduce - bwd_last) + max(0.0, gather - fwd_first)
    else:
        exposed = reduce + gather

    # Per layer, per micro-batch collectives (exposed).
    local_tokens = layout.local_tokens
    layers, mbs = config.num_layers, layout.micro_batches
    forward_repeats = 2 if layout.recompute == "full" else 1
    moe_repeats = 2 if layout.recompute == "full" or layout.recomputes_moe else 1
    kv_bytes = local_tokens * 2 * rank_config.num_query_groups * config.kv_channels * 2 / tp
    cp_time = 0.0
    if cp > 1:
        gathered = kv_bytes * cp
        cp_time = layers * mbs * (forward_repeats + 1) * ring_time(gathered, cp, tp, **args)
    ep_time = 0.0
    if ep > 1:
        a2a = local_tokens * config.hidden_size * 2 / tp
        ep_time = layers * mbs * (2 * moe_repeats + 2) * ring_time(a2a, ep, tp, **args)
    tp_time = 0.0
    if tp > 1:
        act = local_tokens * config.hidden_size * 2
        tp_time = layers * mbs * (forward_repeats + moe_repeats + 2) * ring_time(act, tp, 1, passes=2, **args)
    return StepTime(compute, optimizer_time, reduce + gather, exposed, cp_time, ep_time, tp_time, model_flops, executed)
