"""Tensor parallelism: how each weight is split over TP ranks, the vocab-parallel embedding and
LM head + cross-entropy (logits never gathered: 262K vocab), and the parallel CCA forward.

Splits (rank t of TP, HQ/TP query heads and HKV/TP KV heads per rank):
  linear_q, linear_k           rows of this rank's heads (column-parallel)
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
import torch.nn.functional as F
from torch import nn

from megatron_zaya import kernels
from megatron_zaya.model.cca import CompressedConvAttention
from megatron_zaya.model.zaya import ZayaModel
from megatron_zaya.parallel.context import context_parallel_attention
from megatron_zaya.parallel.mappings import (copy_to_group, gather_along, reduce_from_group,
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
    q_rows, k_rows = _ranges(hq * dh, tp), _ranges(hkv * dh, tp)
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
    split_parameter(attn, "key_temperature", "tp", 0, _ranges(hkv, tp), rank)
    split_parameter(attn.linear_proj, "weight", "tp", 1, q_rows, rank)
    attn.num_heads, attn.num_kv_heads = hq // tp, hkv // tp
    local_channels = (attn.num_heads + attn.num_kv_heads) * dh
    attn.conv_depthwise.groups = attn.conv_depthwise.in_channels = attn.conv_depthwise.out_channels = local_channels
    attn.conv_grouped.in_channels = attn.conv_grouped.out_channels = local_channels
    attn.conv_grouped.groups = attn.num_heads + attn.num_kv_heads


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
    halo exchange, K/V all-gather). Same parameters and names as the single-device module."""

    pstate = None

    def forward(self, x, cos, sin, attention_mask=None):
        ps = self.pstate
        x = enter_tp_region(x, ps)
        if ps.cp_size > 1:
            if attention_mask is not None:
                raise NotImplementedError("attention_mask under context parallelism (use the causal default)")
            out = context_parallel_attention(self, x, cos, sin, ps)
        else:
            q, k, v, _, _ = self.project(x)
            q, k = self.normalize_and_rotate(q, k, cos, sin)
            out = self.attend(q, k, v, attention_mask)
        return exit_tp_region(self.linear_proj(out), ps)


class VocabParallelEmbedding(nn.Embedding):
    """Rows [vocab_start, vocab_end) on this rank; other tokens give zeros, summed over TP."""

    pstate = None
    vocab_start = 0

    def forward(self, tokens):
        local = tokens - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
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
    for block in model.layers:
        split_attention(block.attention, tp, rank)
        split_expert_ffn(block.moe.experts, tp, rank)
    if pstate.sequence_parallel:
        mark_sequence_parallel_params(model)
