"""Packed documents: several documents in one sequence, kept apart (--reset-attention-mask).

A batch describes them by document ids, (B, S) integers that change where a document starts (the data
pipeline counts the EOD tokens before each position). From them come, when first asked for and then
kept for every layer of the forward:

* the attention mask, (B, 1, S, S): causal and inside the query's own document, given to SDPA as an
  additive bias in the attention's dtype (0 or -inf). SDPA would turn a boolean mask into such a bias in
  every call, and each layer's backward would keep its own copy; one shared bias is kept once;
* the lag visibility CCA's convolutions and value shift read, (B, S, lags) bool: whether step t may
  see step t - l (the same document, and not before the sequence start).

Under context parallelism a rank holds two chunks of the sequence: parallel/context.py gathers the
whole sequence's ids once per forward (`cache`) and builds each chunk's mask and halo visibility from
them, so no rank ever builds the S x S mask.
"""
from __future__ import annotations

import torch


def lag_visibility_of_ids(document_ids: torch.Tensor, lags: int) -> torch.Tensor:
    """(B, S, lags) bool: step t sees step t - l (l = 1 .. lags) when both lie in one document."""
    b, s = document_ids.shape
    columns = []
    for lag in range(1, lags + 1):
        same = document_ids[:, lag:] == document_ids[:, :-lag] if lag < s else document_ids.new_zeros(b, 0).bool()
        columns.append(torch.cat((same.new_zeros(b, min(lag, s)), same), dim=1))
    return torch.stack(columns, dim=-1)


def document_attention_mask(query_ids: torch.Tensor, key_ids: torch.Tensor, query_start: int = 0) -> torch.Tensor:
    """(B, 1, Sq, Sk) bool, True = attend: query i (at position query_start + i) sees key j <= its position
    in its own document. Keys are positions 0 .. Sk - 1."""
    sq, sk = query_ids.shape[1], key_ids.shape[1]
    positions = torch.arange(query_start, query_start + sq, device=query_ids.device)
    causal = torch.arange(sk, device=key_ids.device)[None, :] <= positions[:, None]
    return ((query_ids[:, :, None] == key_ids[:, None, :]) & causal)[:, None]


def additive_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True = attend) as an additive attention bias: 0 where True, -inf elsewhere."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


class PackedDocuments:
    """The documents of a batch, (B, S) ids: what attention and CCA need to keep them apart, built once."""

    def __init__(self, document_ids: torch.Tensor):
        if document_ids.dim() != 2 or document_ids.is_floating_point() or document_ids.dtype == torch.bool:
            raise ValueError(f"document_ids must be (B, S) integers, got {tuple(document_ids.shape)} "
                             f"{document_ids.dtype}")
        self.ids = document_ids
        self.cache: dict = {}       # derived tensors, shared by the layers of one forward

    def attention_mask(self) -> torch.Tensor:
        """(B, 1, S, S) bool, True = attend."""
        if "mask" not in self.cache:
            self.cache["mask"] = document_attention_mask(self.ids, self.ids)
        return self.cache["mask"]

    def attention_bias(self, dtype: torch.dtype) -> torch.Tensor:
        """The mask as SDPA's additive bias in `dtype` (0 = attend, -inf = not), one for every layer."""
        key = ("bias", dtype)
        if key not in self.cache:      # the boolean mask is not kept beside it (full recomputation holds this object)
            mask = self.cache.get("mask")
            self.cache[key] = additive_bias(document_attention_mask(self.ids, self.ids) if mask is None else mask, dtype)
        return self.cache[key]

    def visibility(self, lags: int) -> torch.Tensor:
        """(B, S, lags) bool: whether step t may see step t - l (lag_visibility_of_ids)."""
        key = ("visible", lags)
        if key not in self.cache:
            self.cache[key] = lag_visibility_of_ids(self.ids, lags)
        return self.cache[key]
