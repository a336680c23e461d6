"""Context parallelism for CCA: the sequence split over CP ranks with Megatron's load-balanced
causal split, K/V all-gathered, and the convolution / value-shift boundaries handled by a
point-to-point halo exchange.

Split: the sequence is cut into 2*CP equal chunks; CP rank i holds chunks i and 2*CP-1-i (so every
rank does the same amount of causal attention work). The sequence length must be divisible by
2*CP, and each chunk must be at least the conv context (2 tokens).

Halo: the left neighbour of a chunk c is chunk c-1. Each rank receives the last `conv_context`
normed hidden rows x of that chunk (2 rows; the last one is also the value-shift input) and
projects them with its own weights to the pre-conv q0/k0 and the delayed value Wv2 x - the
`LeftContext` of the CCA module. For rank i: chunk i's left is chunk i-1 (first chunk of rank
i-1), chunk 2CP-1-i's left is chunk 2CP-2-i (second chunk of rank i+1, or for the last rank its
own first chunk). Rank 0's first chunk gets zeros, which is exactly the zero padding of one
process (the projections have no bias). Gradients flow back through the exchange (send_recv).

K and V (post-norm, post-RoPE; 2*HKV*dh values per token) are all-gathered over CP and put back
in sequence order; each local chunk's queries attend to the keys up to the chunk's end with a
bottom-right-aligned causal bias (no S x S mask is built).

Packed documents (PackedDocuments, --reset-attention-mask): the ranks' document ids are all-gathered
once per forward (`whole_sequence_documents`). Each chunk then attends with a (half x end) mask, causal
and inside each query's document, and its convolutions and value shift restart at document starts:
the halo steps go in front of the chunk with their own lag visibility (LeftContext.visible).
"""
from __future__ import annotations

import functools

import torch

from megatron_zaya.model import recompute
from megatron_zaya.model.cca import LeftContext, kv_for_sdpa
from megatron_zaya.model.documents import (PackedDocuments, additive_bias, document_attention_mask,
                                           lag_visibility_of_ids)
from megatron_zaya.parallel.mappings import gather_along, send_recv


def cp_chunk_indices(seq_len: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Global token indices held by a CP rank (chunks i and 2*CP-1-i), in local order."""
    if cp_size == 1:
        return torch.arange(seq_len)
    if seq_len % (2 * cp_size):
        raise ValueError(f"sequence length {seq_len} must be divisible by 2 x --context-parallel-size "
                         f"= {2 * cp_size} (load-balanced causal split)")
    c = seq_len // (2 * cp_size)
    first, second = cp_rank, 2 * cp_size - 1 - cp_rank
    return torch.cat((torch.arange(first * c, (first + 1) * c), torch.arange(second * c, (second + 1) * c)))


def slice_batch_for_cp(batch: dict, pstate) -> dict:
    """This rank's CP slice of every (B, S) tensor of a micro-batch (tokens, labels, loss_mask,
    position_ids, ...); other entries pass through. position_ids are needed under CP: the model
    cannot infer global positions from a slice."""
    if pstate.cp_size == 1:
        return dict(batch)
    out = {}
    seq_len = batch["tokens"].shape[1]
    index = cp_chunk_indices(seq_len, pstate.cp_size, pstate.cp_rank)
    for key, value in batch.items():
        if torch.is_tensor(value) and value.dim() == 2 and value.shape[1] == seq_len:
            out[key] = value.index_select(1, index.to(value.device))
        else:
            out[key] = value
    if "position_ids" not in out:
        out["position_ids"] = index.to(batch["tokens"].device).unsqueeze(0).expand(batch["tokens"].shape[0], -1)
    return out


def exchange_halo(x: torch.Tensor, width: int, pstate) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, S_local, D) holding [chunk i, chunk 2CP-1-i] -> the `width` rows left of each chunk."""
    r, n, ranks = pstate.cp_rank, pstate.cp_size, pstate.cp_ranks
    half = x.shape[1] // 2
    tail0, tail1 = x[:, half - width:half], x[:, x.shape[1] - width:]
    nxt = ranks[r + 1] if r + 1 < n else None
    prv = ranks[r - 1] if r > 0 else None
    # First chunks flow right: rank r's chunk r is the left context of rank r+1's chunk r+1.
    # Second chunks flow left: rank r's chunk 2CP-1-r is the left context of rank r-1's chunk 2CP-r.
    left0, left1 = send_recv([tail0, tail1], dsts=[nxt, prv], srcs=[prv, nxt])
    if nxt is None:
        left1 = tail0   # the last rank holds chunks CP-1 and CP: adjacent
    return left0, left1


@functools.lru_cache(maxsize=16)
def gathered_sequence_order(seq_len: int, cp_size: int, device: torch.device) -> torch.Tensor:
    """Indices that put K/V all-gathered in rank order (each rank's two chunks) back in sequence
    order; built once per (length, CP size, device), not on the host in every layer."""
    held = torch.cat([cp_chunk_indices(seq_len, cp_size, r) for r in range(cp_size)])
    return torch.argsort(held).to(device)


def left_context_from_hidden(attn, x_left: torch.Tensor, visible: torch.Tensor | None = None) -> LeftContext:
    """The LeftContext of the neighbour's last `attn.lookback` hidden rows, projected with this rank's weights
    (the same as the neighbour's): the convolutions' last conv_context steps (none with kernels of 1 and 1)
    and the value shift's last step; `visible`: those rows' lag visibility."""
    packed, _, v_delayed = attn.input_projections(x_left)       # the module's own (possibly TP-local) projections
    drop = x_left.shape[1] - attn.conv_context
    return LeftContext(packed[:, drop:].transpose(1, 2), v_delayed[:, -1:],
                       None if visible is None else visible[:, drop:])


def whole_sequence_documents(documents: PackedDocuments, pstate) -> torch.Tensor:
    """The document ids of the whole sequence (B, S), in sequence order, from each CP rank's two chunks;
    gathered once per forward (kept in the PackedDocuments' cache for the other layers)."""
    if "cp_ids" not in documents.cache:
        gathered = gather_along(documents.ids, pstate.cp_group, 1)
        order = gathered_sequence_order(gathered.shape[1], pstate.cp_size, gathered.device)
        documents.cache["cp_ids"] = gathered.index_select(1, order)
    return documents.cache["cp_ids"]


def chunk_visibility(documents: PackedDocuments, pstate, chunks: tuple[int, int], half: int, width: int):
    """For the two chunks stacked on the batch dimension (2B, ...): the lag visibility of their steps
    and of the `width` halo steps left of each (False before the sequence start), from the whole
    sequence's ids (cached per forward)."""
    key = ("cp_visible", width)
    if key not in documents.cache:
        ids = whole_sequence_documents(documents, pstate)
        visible = lag_visibility_of_ids(ids, width)                  # (B, S, width)
        padded = torch.cat((visible.new_zeros(visible.shape[0], width, width), visible), dim=1)
        rows = [padded[:, c * half + width:(c + 1) * half + width] for c in chunks]
        halo = [padded[:, c * half:c * half + width] for c in chunks]
        documents.cache[key] = torch.cat(rows), torch.cat(halo)
    return documents.cache[key]


def chunk_bias(documents: PackedDocuments, pstate, chunk: int, half: int, dtype: torch.dtype) -> torch.Tensor:
    """Chunk `chunk`'s (B, 1, half, end) additive attention bias: causal and inside each query's document,
    over the keys up to the chunk's end; built once per forward and shared by the layers."""
    key = ("cp_bias", chunk, dtype)
    if key not in documents.cache:
        ids, end = whole_sequence_documents(documents, pstate), (chunk + 1) * half
        mask = document_attention_mask(ids[:, chunk * half:end], ids[:, :end], query_start=chunk * half)
        documents.cache[key] = additive_bias(mask, dtype)
    return documents.cache[key]


def context_parallel_attention(attn, x, cos, sin, pstate, documents: PackedDocuments | None = None) -> torch.Tensor:
    """CCA `project` + `normalize_and_rotate` + `attend` + `linear_proj` on this rank's two chunks; returns
    the projected output, (B, S_local, D) (this rank's partial sum under TP). With `documents` every document
    of a packed sequence is kept apart, as in one process."""
    b, s_local, _ = x.shape
    width = attn.lookback
    if s_local % 2 or s_local // 2 < width:
        raise ValueError(f"context parallel: local sequence {s_local} must be two chunks of >= {width} tokens")
    half = s_local // 2
    chunks = (pstate.cp_rank, 2 * pstate.cp_size - 1 - pstate.cp_rank)
    visible = halo_visible = None
    if documents is not None:
        visible, halo_visible = chunk_visibility(documents, pstate, chunks, half, width)
    left0, left1 = exchange_halo(x, width, pstate)
    left = left_context_from_hidden(attn, torch.cat((left0, left1)), halo_visible)    # both chunks' at once
    # Both chunks through `project` at once, stacked on the batch dimension.
    q, k, v, _, _ = attn.project(torch.cat((x[:, :half], x[:, half:])), left, visible)
    q, k, v = (torch.cat((t[:b], t[b:]), dim=1) for t in (q, k, v))
    q, k = attn.normalize_and_rotate(q, k, cos, sin)
    if hasattr(attn, "replicated_kv"):
        k, v = attn.replicated_kv(k, v)
    k_all, v_all = gather_along(k, pstate.cp_group, 1), gather_along(v, pstate.cp_group, 1)
    # Gathered K/V come in rank order (each rank's two chunks): put them back in sequence order.
    order = gathered_sequence_order(s_local * pstate.cp_size, pstate.cp_size, x.device)
    k_all, v_all = k_all.index_select(1, order), v_all.index_select(1, order)
    # Chunk c's queries see keys [0, end of chunk c): causal aligned to the bottom right, which
    # SDPA handles without a materialised mask (flash / memory-efficient kernels on GPUs).
    # (imported here: torch.nn.attention.bias imports torch._dynamo, 1.5 s of every process's start)
    from torch.nn.attention.bias import causal_lower_right

    ends = [(chunk + 1) * half for chunk in chunks]
    masks = [causal_lower_right(half, end) if documents is None else chunk_bias(documents, pstate, chunk, half, q.dtype)
             for chunk, end in zip(chunks, ends)]
    # K/V made ready for SDPA once (cca.kv_for_sdpa: repeated to the query heads where only that keeps SDPA off its
    # math path), for the later chunk, whose keys hold the earlier one's: each chunk reads a prefix of them, and
    # the backward keeps one repeated copy, not one per chunk.
    k_ready, v_ready = k_all[:, :ends[1]].transpose(1, 2), v_all[:, :ends[1]].transpose(1, 2)
    k_ready, v_ready, gqa, _ = kv_for_sdpa(q[:, half:].transpose(1, 2), k_ready, v_ready, masks[1], attn.groups)
    outputs = []
    for part, (end, mask) in enumerate(zip(ends, masks)):
        qc = q[:, part * half:(part + 1) * half].transpose(1, 2)
        kc, vc = k_ready[:, :, :end], v_ready[:, :, :end]
        math = recompute.sdpa_keeps_scores(qc, kc, vc, mask, gqa)
        # Each chunk projected on its own: linear_proj keeps the attention output it reads, which for flash
        # attention is a view of the output the core keeps anyway (a concatenation first would be a copy
        # kept beside them, 2 HQ dh bytes per token and layer).
        outputs.append(attn.linear_proj(attn.attend_prepared(qc, kc, vc, gqa, math, mask)))
    return torch.cat(outputs, dim=1)
