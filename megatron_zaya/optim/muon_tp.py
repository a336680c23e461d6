"""Muon under tensor parallelism: Newton-Schulz on whole matrices (--muon-tp-mode duplicated).

A TP-split matrix lives as one slice per TP rank (`param.partitions`, megatron_zaya/parallel/tensor.py:
rows of column-parallel weights, columns of row-parallel ones, the gate and up halves of an expert,
a KV head replicated on several ranks when TP > KV heads). Newton-Schulz is not element-wise, so
orthogonalising each slice on its own (Megatron-LM's "blockwise" mode) gives an update that depends
on the TP size. "duplicated": the ranks of a TP group all-gather their slices' momentum directions
(the matrices of one call packed into one flat buffer, one collective; muon.tp_orthogonalized_updates
calls it per chunk of matrices), each rank runs Newton-Schulz on the whole matrices and keeps its
own slice of the update. That is single-device Muon exactly (momentum is element-wise, so it stays
on the slices), at TP times the Newton-Schulz work.

Every rank of the TP group must call `whole_directions` with the same matrices in the same order
(the model is built the same way on every rank, so parameter order is).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from megatron_zaya.parallel.collectives import all_gather_single


def tp_partition(param) -> tuple[int, list] | None:
    """(dim, pieces per TP rank) of a TP-split parameter, None when TP does not split it."""
    for kind, dim, pieces in getattr(param, "partitions", []) or []:
        if kind == "tp":
            return dim, pieces
    return None


def whole_numel(param) -> int:
    """Elements of the parameter with its TP split undone (the size of the matrix Muon orthogonalises)."""
    split = tp_partition(param)
    if split is None:
        return param.numel()
    dim, pieces = split
    shape = list(param.shape)
    shape[dim] = _whole_length(pieces)
    return math.prod(shape)


def _whole_length(pieces) -> int:
    return max((b for rank_pieces in pieces for _a, b in rank_pieces), default=0)


def _slice_shape(shape, dim: int, pieces, rank: int) -> list[int]:
    shape = list(shape)
    shape[dim] = sum(b - a for a, b in pieces[rank])
    return shape


def whole_directions(params: list, directions: list[torch.Tensor], group) -> list[torch.Tensor]:
    """For each parameter its direction over the whole matrix: TP-split ones gathered from the TP
    group (replicated slices land on the same place), the others returned as they are."""
    size = dist.get_world_size(group) if group is not None else 1
    split = [i for i, p in enumerate(params) if tp_partition(p) is not None]
    if size == 1 or not split:
        return list(directions)
    rank = dist.get_rank(group)
    shapes = {i: [_slice_shape(directions[i].shape, *tp_partition(params[i]), r) for r in range(size)]
              for i in split}
    lengths = [sum(math.prod(shapes[i][r]) for i in split) for r in range(size)]
    width = max(lengths)
    device = directions[split[0]].device
    mine = torch.zeros(width, dtype=torch.float32, device=device)
    if lengths[rank]:
        mine[:lengths[rank]] = torch.cat([directions[i].reshape(-1).float() for i in split])
    every = torch.empty(size * width, dtype=torch.float32, device=device)
    all_gather_single(every, mine, group=group)
    offsets = [r * width for r in range(size)]
    out = list(directions)
    for i in split:
        dim, pieces = tp_partition(params[i])
        shape = list(directions[i].shape)
        shape[dim] = _whole_length(pieces)
        whole = torch.empty(shape, dtype=torch.float32, device=device)
        for r in range(size):
            n = math.prod(shapes[i][r])
            chunk = every[offsets[r]:offsets[r] + n].view(shapes[i][r])
            offsets[r] += n
            start = 0
            for a, b in pieces[r]:
                whole.narrow(dim, a, b - a).copy_(chunk.narrow(dim, start, b - a))
                start += b - a
        out[i] = whole
    return out


def local_slices(params: list, updates: list[torch.Tensor], group) -> list[torch.Tensor]:
    """The inverse of whole_directions: this rank's slice of each whole-matrix update."""
    if group is None or dist.get_world_size(group) == 1:
        return list(updates)
    rank = dist.get_rank(group)
    out = []
    for p, update in zip(params, updates):
        split = tp_partition(p)
        if split is None:
            out.append(update)
            continue
        dim, pieces = split
        parts = [update.narrow(dim, a, b - a) for a, b in pieces[rank]]
        out.append(torch.cat(parts, dim=dim) if parts else update.narrow(dim, 0, 0))
    return out
