"""Tensor parallelism: how each weight is split over TP ranks, the vocab-parallel embedding and
LM head + cross-entropy (logits never gathered: 262K vocab), and the parallel CCA forward.

Splits (rank t of TP, HQ/TP query heads and HKV/TP KV heads per rank):
  linear_q, linear_k           rows of this rank's heads (column-parallel); when TP > HKV each KV
                               head is replicated on TP/HKV ranks (see ParallelCCA)
  linear_v_current/_previous   the rows of this rank's KV heads. v = cat(v_current, v_shifted)
                               viewed as HKV heads, so a KV head's channels come from one or both
                               projections: with HKV=2, TP=2, rank 0 holds all of v_current
                               and none of v_previous, rank 1 the opposite.
  conv_depthwise/_grouped      the q channels and k channels of this rank's heads (per-head convs)
  key_temperature              this rank's KV heads
  linear_proj                  columns of this rank's query heads (row-parallel: all-reduce after)
  embedding                    rows [t*V/TP, (t+1)*V/TP) (vocab-parallel; tied LM head the same)
  experts                      the FFN dimension: gate and up rows, down columns (expert-TP = TP)
  router, norms, residual scaling   replicated
Sequence parallelism (--sequence-parallel): between the TP regions (norms, residual merges, the
router) each TP rank holds S/TP tokens; entering attention / the experts / the LM head all-gathers
the sequence, leaving them reduce-scatters it (instead of all-reduce), so activations outside the
TP regions are not replicated.
Every split is recorded on the parameter (`param.partitions`) so gather_full_state_dict can undo it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from megatron_zaya import kernels
from megatron_zaya.model.cca import CompressedConvAttention, sdpa_mask, visibility_of
from megatron_zaya.model.documents import PackedDocuments
from megatron_zaya.model.zaya import ZayaModel
from megatron_zaya.parallel.context import context_parallel_attention
from megatron_zaya.parallel.mappings import (copy_to_group, gather_along, gradient_only_if, reduce_from_group,
                                             reduce_scatter_along)


def split_parameter(module: nn.Module, name: str, kind: str, dim: int, pieces_per_rank: list[list[tuple[int, int]]],
                    rank: int) -> nn.Parameter:
    """Replace module.<name> by the concatenation of its [start, end) pieces along dim for `rank`,
    recording (kind, dim, pieces_per_rank) so the split can be undone (kind: "tp" or "ep")."""
    full = getattr(module, name)
    parts = [full.detach().narrow(dim, a, b - a) for a, b in pieces_per_rank[rank]]
    shard = nn.Parameter(torch.cat(parts, dim=dim).clone() if parts else full.detach().narrow(dim, 0, 0).clone(), full.requires_grad)
    for attr, value in vars(full).items():     # keep earlier markers (is_expert, partitions, ...)
        setattr(shard, attr, value)
    shard.partitions = list(getattr(full, "partitions", [])) + [(kind, dim, pieces_per_rank)]
    if kind == "tp":
        shard.tensor_model_parallel = True
    setattr(module, name, shard)
    return shard


def _ranges(width: int, size: int) -> list[list[tuple[int, int]]]:
    step = width // size
    return [[(r * step, (r + 1) * step)] for r in range(size)]


def split_attention(attn: CompressedConvAttention, tp: int, rank: int) -> None:
    hq, hkv, dh = attn.num_heads, attn.num_kv_heads, attn.head_dim
    replicas = tp // hkv if tp > hkv else 1          # ranks sharing one KV head when TP > HKV
    q_rows = _ranges(hq * dh, tp)
    kv_heads = [[(r // replicas, r // replicas + 1)] for r in range(tp)] if replicas > 1 else _ranges(hkv, tp)
    k_rows = [[(a * dh, b * dh)] for ((a, b),) in kv_heads]
    # The value concat [current | shifted] of width HKV*dh, cut at the KV-head boundaries.
    half = hkv * dh // 2
    current = [[(a, min(b, half))] if a < half else [] for ((a, b),) in k_rows]
    previous = [[(max(a, half) - half, b - half)] if b > half else [] for ((a, b),) in k_rows]
    channels = [q + [(hq * dh + a, hq * dh + b) for a, b in k] for q, k in zip(q_rows, k_rows)]
    split_parameter(attn.linear_q, "weight", "tp", 0, q_rows, rank)
    split_parameter(attn.linear_k, "weight", "tp", 0, k_rows, rank)
    split_parameter(attn.linear_v_current, "weight", "tp", 0, current, rank)
    split_parameter(attn.linear_v_previous, "weight", "tp", 0, previous, rank)
    for conv in (attn.conv_depthwise, attn.conv_grouped):
        split_parameter(conv, "weight", "tp", 0, channels, rank)
        split_parameter(conv, "bias", "tp", 0, channels, rank)
    split_parameter(attn, "key_temperature", "tp", 0, kv_heads, rank)
    split_parameter(attn.linear_proj, "weight", "tp", 1, q_rows, rank)
    attn.num_heads, attn.num_kv_heads = hq // tp, max(1, hkv // tp)
    local_channels = (attn.num_heads + attn.num_kv_heads) * dh
    attn.conv_depthwise.groups = attn.conv_depthwise.in_channels = attn.conv_depthwise.out_channels = local_channels
    attn.conv_grouped.in_channels = attn.conv_grouped.out_channels = local_channels
    attn.conv_grouped.groups = attn.num_heads + attn.num_kv_heads
    attn.kv_replicas = replicas
    if replicas > 1:
        # This rank holds part of its KV head's query heads; the KV head itself is replicated.
        attn.query_groups_global, attn.groups = attn.groups, attn.num_heads
        primary = rank % replicas == 0
        q_width = attn.num_heads * dh
        for p, rows in ((attn.linear_k.weight, (0, dh)), (attn.key_temperature, (0, 1)),
                        (attn.linear_v_current.weight, (0, attn.linear_v_current.weight.shape[0])),
                        (attn.linear_v_previous.weight, (0, attn.linear_v_previous.weight.shape[0])),
                        (attn.conv_depthwise.weight, (q_width, q_width + dh)),
                        (attn.conv_depthwise.bias, (q_width, q_width + dh)),
                        (attn.conv_grouped.weight, (q_width, q_width + dh)),
                        (attn.conv_grouped.bias, (q_width, q_width + dh))):
            p.tp_replicated_rows, p.tp_replica_primary = rows, primary


def split_expert_ffn(experts, tp: int, rank: int) -> None:
    ffn = experts.down_weight.shape[-1]
    rows = _ranges(ffn, tp)
    split_parameter(experts, "gate_up_weight", "tp", 1, [r + [(ffn + a, ffn + b) for a, b in r] for r in rows], rank)
    split_parameter(experts, "down_weight", "tp", 2, rows, rank)


def enter_tp_region(x, ps):
    """Into a column-parallel region: the full (replicated) input, (B, S, D). With sequence
    parallelism the residual stream holds S/TP tokens per rank and is all-gathered here."""
    return gather_along(x, ps.tp_group, 1) if ps.sequence_parallel else copy_to_group(x, ps.tp_group)


def exit_tp_region(partial, ps):
    """Out of a row-parallel region: sum the partial outputs over TP (reduce-scatter over the
    sequence under sequence parallelism)."""
    if ps.sequence_parallel:
        return reduce_scatter_along(partial, ps.tp_group, 1)
    return reduce_from_group(partial, ps.tp_group)


def mark_sequence_parallel_params(model: ZayaModel) -> None:
    """Replicated parameters applied to sequence-sharded activations (norms, residual and input
    scaling, the router) see different tokens on each TP rank: their gradients are partial over TP
    and are reduced over the whole world (TP x DP x CP) by the GradientReducer."""
    for module in [model.input_scaling, model.final_norm] + [m for b in model.layers for m in
                   (b.input_norm, b.attention_residual, b.pre_mlp_norm, b.mlp_residual, b.moe.router)]:
        for p in module.parameters():
            p.sequence_parallel = True


class ParallelCCA(CompressedConvAttention):
    """CCA under TP (local heads: input copied in, output all-reduced) and/or CP (two chunks,
    halo exchange, K/V all-gather). Same parameters and names as the single-device module.

    KV-head replication (TP > HKV, R = TP / HKV ranks per KV head): each rank computes its KV head
    in full and 1/R of that head's query heads. Exact gradients need three reductions over the R
    replicas (`kv_group`): the q-k mean of the KV head sums the query heads of all replicas
    (all-reduce); k and v (after norm and RoPE) and the k0 used in the local q-k means get their
    gradients summed over the replicas (identity forward, all-reduce backward), so the replicated
    weights hold identical, complete gradients; and only the first replica hands the replicated
    projections' input gradient back to x (the TP all-reduce would count it R times otherwise)."""

    pstate = None
    kv_replicas = 1
    kv_group = None
    kv_primary = True

    def replicated_input(self, x):
        return x if self.kv_replicas == 1 else gradient_only_if(x, self.kv_primary)

    def replicated_kv(self, k, v):
        if self.kv_replicas == 1:
            return k, v
        return copy_to_group(k, self.kv_group), copy_to_group(v, self.kv_group)

    def input_projections(self, x):
        if self.kv_replicas == 1:
            return super().input_projections(x)
        # The replicated KV head's projections read x through replicated_input (its input gradient
        # from the first replica only): one matmul for q0, one for the stacked k0 | v_current | v_previous,
        # on one low-precision copy of x under autocast (each matmul casting it would keep two for the backward).
        if torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.get_autocast_dtype(x.device.type))
        weights = (self.linear_k.weight, self.linear_v_current.weight, self.linear_v_previous.weight)
        k0, v_current, v_delayed = F.linear(self.replicated_input(x), torch.cat(weights)).split(
            [w.shape[0] for w in weights], dim=-1)
        return torch.cat((self.linear_q(x), k0), dim=-1), v_current, v_delayed

    def project(self, x, left=None, visible=None):
        if self.kv_replicas == 1:
            return super().project(x, left, visible)
        # CompressedConvAttention.project with one local KV head whose query heads span R replicas.
        b, s, _ = x.shape
        dh = self.head_dim
        q_width = self.num_heads * dh
        packed, v_current, v_delayed = self.input_projections(x)
        q0, k0 = packed.split((q_width, dh), dim=-1)
        q0_heads, k0_head = q0.view(b, s, self.num_heads, dh), k0.view(b, s, 1, dh)
        mean_q = (copy_to_group(k0_head, self.kv_group) + q0_heads) * 0.5
        q_sum = reduce_from_group(q0_heads.sum(dim=2, keepdim=True), self.kv_group)
        mean_k = q_sum / (2 * self.query_groups_global) + k0_head * 0.5
        mixed_q, mixed_k = self.causal_conv(packed, left, visible).split((q_width, dh), dim=-1)
        q = mean_q + mixed_q.reshape(b, s, self.num_heads, dh)
        k = mean_k + mixed_k.reshape(b, s, 1, dh)
        v = torch.cat((v_current, self.shift_values(v_delayed, left, visible)), dim=-1).view(b, s, 1, dh)
        return q, k, v, packed.transpose(1, 2), v_delayed

    def forward(self, x, cos, sin, attention_mask=None):
        ps = self.pstate
        x = enter_tp_region(x, ps)
        if ps.cp_size > 1:
            if attention_mask is not None and not isinstance(attention_mask, PackedDocuments):
                raise NotImplementedError("a dense attention_mask under context parallelism (packed documents "
                                          "go as document ids: PackedDocuments)")
            out = context_parallel_attention(self, x, cos, sin, ps, attention_mask)      # projected per chunk
        else:
            q, k, v, _, _ = self.project(x, visible=visibility_of(attention_mask, self.lookback))
            q, k = self.normalize_and_rotate(q, k, cos, sin)
            k, v = self.replicated_kv(k, v)
            out = self.linear_proj(self.attend(q, k, v, sdpa_mask(attention_mask, q.dtype)))
        return exit_tp_region(out, ps)


class VocabParallelEmbedding(nn.Embedding):
    """Rows [vocab_start, vocab_end) on this rank; other tokens give zeros, summed over TP."""

    pstate = None
    vocab_start = 0

    def forward(self, tokens):
        local = tokens - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = kernels.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return exit_tp_region(out, self.pstate)


class TensorParallelZayaModel(ZayaModel):
    """ZayaModel whose LM head is vocab-parallel: local logits columns, vocab-parallel cross-entropy."""

    pstate = None

    def head_and_loss(self, hidden, labels):
        ps = self.pstate
        hidden = enter_tp_region(hidden, ps)
        logits = F.linear(hidden, self.output_weight())
        if labels is None:
            return gather_along(logits, ps.tp_group, logits.dim() - 1), None
        b, s = labels.shape
        start = self.embedding.vocab_start
        losses = kernels.vocab_parallel_cross_entropy(logits.reshape(b * s, -1), labels.reshape(b * s), start,
                                                      ps.tp_group)
        return None, losses.view(b, s)


def apply_tensor_parallel(model: ZayaModel, pstate) -> None:
    tp, rank = pstate.tp_size, pstate.tp_rank
    vocab = model.embedding.weight.shape[0]
    split_parameter(model.embedding, "weight", "tp", 0, _ranges(vocab, tp), rank)
    model.embedding.__class__ = VocabParallelEmbedding
    model.embedding.pstate, model.embedding.vocab_start = pstate, rank * (vocab // tp)
    if model.output_layer is not None:
        split_parameter(model.output_layer, "weight", "tp", 0, _ranges(vocab, tp), rank)
    model.__class__ = TensorParallelZayaModel
    hkv = model.config.num_query_groups
    kv_group = None
    # One group per KV head's replicas (new_group is collective: every rank makes all); none for a layout
    # built without a process group (the offline checkpoint writer: it only slices weights).
    if tp > hkv and pstate.world_group is not None:
        replicas = tp // hkv
        for tp_ranks in pstate.grid["tp"]:
            for g in range(hkv):
                ranks = tp_ranks[g * replicas:(g + 1) * replicas]
                group = dist.new_group(ranks)
                if pstate.rank in ranks:
                    kv_group = group
    for block in model.layers:
        split_attention(block.attention, tp, rank)
        split_expert_ffn(block.moe.experts, tp, rank)
        if kv_group is not None:
            block.attention.kv_group, block.attention.kv_primary = kv_group, rank % (tp // hkv) == 0
    if pstate.sequence_parallel:
        mark_sequence_parallel_params(model)
