"""Where a checkpoint entry's data sits in its global tensor, and a rank's block read from saved pieces.

An entry describes its data by `ranges` (per dimension, the [start, end) runs of global indices of the
block it belongs to: a TP slice of the experts' fused gate/up weight is two runs) and `flat` ([a, b]:
elements a..b of the block's row-major flattening, a ZeRO-1 piece; None: the whole block). A rank that
needs a block (or a flat part of one) that no saved entry holds as such takes it from the saved pieces
that overlap it, and reads only their overlapping parts (RankFile.get_box): row shares of a replicated
tensor read in other shares (replica_owners), TP / EP slices of another layout, ZeRO-1 pieces under
another data-parallel size or another TP / EP layout. CheckpointFolder.piece (format.py) uses these.
"""
from __future__ import annotations

import itertools
import math

import torch

Ranges = list  # per dimension: [[start, end], ...]


def index_runs(index: torch.Tensor) -> list[list[int]]:
    """Compress a 1-D index tensor into [start, end) runs."""
    n = index.numel()
    if n == 0:
        return []
    breaks = (torch.nonzero(index[1:] - index[:-1] != 1).flatten() + 1).tolist()
    starts, ends = [0] + breaks, breaks + [n]
    return [[int(index[a]), int(index[b - 1]) + 1] for a, b in zip(starts, ends)]


def ranges_shape(ranges: Ranges) -> list[int]:
    return [sum(b - a for a, b in runs) for runs in ranges]


def narrow_ranges(ranges: Ranges, rows: tuple[int, int] | None) -> Ranges:
    """`ranges` of a block, narrowed to its local rows a..b (positions along dimension 0; None: all)."""
    if rows is None:
        return ranges
    a, b = rows
    runs, seen = [], 0
    for start, end in ranges[0]:
        lo, hi = max(a - seen, 0), min(b - seen, end - start)
        if lo < hi:
            runs.append([start + lo, start + hi])
        seen += end - start
    return [runs] + ranges[1:]


def _run_index(runs) -> torch.Tensor:
    return torch.cat([torch.arange(a, b) for a, b in runs]) if runs else torch.zeros(0, dtype=torch.long)


def read_block(full: torch.Tensor, ranges: Ranges) -> torch.Tensor:
    """The block of `full` described by `ranges` (a copy)."""
    out = full
    for dim, runs in enumerate(ranges):
        if len(runs) == 1:
            a, b = runs[0]
            out = out.narrow(dim, a, b - a)
        else:
            out = out.index_select(dim, _run_index(runs))
    return out.clone()


def write_block(full: torch.Tensor, ranges: Ranges, block: torch.Tensor) -> None:
    """full[ranges] = block (in place)."""
    if all(len(runs) == 1 for runs in ranges):
        view = full
        for dim, ((a, b),) in enumerate(ranges):
            view = view.narrow(dim, a, b - a)
        view.copy_(block)
        return
    index = [_run_index(runs) for runs in ranges]
    grids = torch.meshgrid(*index, indexing="ij") if index else ()
    full[tuple(grids)] = block


def _run_overlaps(target_runs, saved_runs) -> list[tuple[int, int, int]]:
    """(offset in the target block, offset in the saved block, length) of every stretch of global indices
    that a run of the target and a run of the saved block share, along one dimension."""
    out, t_offset = [], 0
    for t_start, t_end in target_runs:
        s_offset = 0
        for s_start, s_end in saved_runs:
            lo, hi = max(t_start, s_start), min(t_end, s_end)
            if lo < hi:
                out.append((t_offset + lo - t_start, s_offset + lo - s_start, hi - lo))
            s_offset += s_end - s_start
        t_offset += t_end - t_start
    return out


def _strides(shape: list[int]) -> list[int]:
    return [math.prod(shape[k + 1:]) for k in range(len(shape))]


def _flat_boxes(shape: list[int], first: int, stop: int, runs: Ranges) -> list[tuple[int, list, list[int]]]:
    """Elements first..stop of a block of `shape` (row-major), whose global indices per dimension are
    `runs`, as boxes each contiguous in that order: (position of its first element counted from `first`,
    its global runs per dimension, its size per dimension). At most two per dimension."""
    strides = _strides(shape)
    out, position = [], first
    while position < stop:
        index = [(position // strides[k]) % shape[k] for k in range(len(shape))]
        for k in range(len(shape)):     # the outermost dimension whose whole steps start here and fit
            count = min((stop - position) // strides[k], shape[k] - index[k]) if position % strides[k] == 0 else 0
            if count:
                break
        sizes = [1] * k + [count] + shape[k + 1:]
        starts = index[:k + 1] + [0] * (len(shape) - k - 1)
        box_runs = [narrow_ranges([dim_runs], (a, a + n))[0] for dim_runs, a, n in zip(runs, starts, sizes)]
        out.append((position - first, box_runs, sizes))
        position += count * strides[k]
    return out


def _copy_overlaps(into: torch.Tensor, seen: torch.Tensor, source: torch.Tensor, per_dim, source_start) -> None:
    """Copy every box of shared indices (a combination of one stretch per dimension, _run_overlaps) from
    `source` (whose first index per dimension is `source_start` of the saved block) into `into`; mark it."""
    for stretches in itertools.product(*per_dim):
        i, c, src = into, seen, source
        for dim, (t_at, s_at, length) in enumerate(stretches):
            i, c = i.narrow(dim, t_at, length), c.narrow(dim, t_at, length)
            src = src.narrow(dim, s_at - source_start[dim], length)
        i.copy_(src)
        c.fill_(True)


def block_from_pieces(key: str, pieces: list, ranges: Ranges, dtype: torch.dtype) -> torch.Tensor | None:
    """The block `ranges` of `key` from the saved whole-block pieces [(rank file, entry)] that overlap it,
    of each only the overlapping part read. None where a piece is a ZeRO-1 flat one (flat_part_from_pieces)
    or the pieces do not cover the block."""
    if not pieces or any(desc["flat"] is not None for _, desc in pieces):
        return None
    out = torch.empty(ranges_shape(ranges), dtype=dtype)
    covered = torch.zeros(out.shape, dtype=torch.bool)
    for rf, desc in pieces:
        per_dim = [_run_overlaps(t, s) for t, s in zip(ranges, desc["ranges"])]
        if not all(per_dim):
            continue
        box = [(min(s for _, s, _ in d), max(s + n for _, s, n in d)) for d in per_dim]
        _copy_overlaps(out, covered, rf.get_box(key, box, ranges_shape(desc["ranges"])), per_dim,
                       [a for a, _ in box])
    return out if bool(covered.all()) else None


def flat_part_from_pieces(key: str, pieces: list, ranges: Ranges, flat: list[int],
                          dtype: torch.dtype) -> torch.Tensor | None:
    """Elements flat[0]..flat[1] of block `ranges` of `key` from the saved pieces that hold them (ZeRO-1
    flat pieces of this block or of another layout's blocks, or whole blocks): both flat ranges cut into
    boxes (_flat_boxes), the parts of the boxes that share global indices copied; of each saved piece only
    the stretch those parts span is read. None where the pieces do not cover the elements."""
    a, b = flat
    one = [[[0, 1]]]                                  # a scalar as a block of one element
    wanted = _flat_boxes(ranges_shape(ranges or one), a, b, ranges or one)
    out = torch.empty(b - a, dtype=dtype)
    covered = torch.zeros(b - a, dtype=torch.bool)
    for rf, desc in pieces:
        saved_ranges = desc["ranges"] or one
        saved_shape = ranges_shape(saved_ranges)
        lo, hi = desc["flat"] if desc["flat"] is not None else (0, math.prod(saved_shape))
        parts = []       # (first and last + 1 position in the piece, start and size of the part per dim, ...)
        for s_offset, s_runs, s_sizes in _flat_boxes(saved_shape, lo, hi, saved_ranges):
            strides = _strides(s_sizes)
            for t_offset, t_runs, t_sizes in wanted:
                per_dim = [_run_overlaps(t, s) for t, s in zip(t_runs, s_runs)]
                if not all(per_dim):
                    continue
                start = [min(s for _, s, _ in d) for d in per_dim]
                stop = [max(s + n for _, s, n in d) for d in per_dim]
                first = s_offset + sum(x * st for x, st in zip(start, strides))
                last = s_offset + sum((x - 1) * st for x, st in zip(stop, strides)) + 1
                parts.append((first, last, start, [y - x for x, y in zip(start, stop)], strides, t_offset,
                              t_sizes, per_dim))
        if not parts:
            continue
        begin = min(p[0] for p in parts)
        data = rf.get_box(key, [(begin, max(p[1] for p in parts))], [hi - lo]).contiguous()
        for first, _last, start, sizes, strides, t_offset, t_sizes, per_dim in parts:
            source = data.as_strided(sizes, strides, data.storage_offset() + first - begin)
            into = out[t_offset:t_offset + math.prod(t_sizes)].view(t_sizes)
            seen = covered[t_offset:t_offset + math.prod(t_sizes)].view(t_sizes)
            _copy_overlaps(into, seen, source, per_dim, start)
    return out if bool(covered.all()) else None
