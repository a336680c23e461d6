"""Owners of replicated model tensors in their replica group: the ranks that write them at a save and read
them at a load (what Megatron-LM's --ckpt-fully-parallel-save / -load do for replicas).

The ranks of a data-parallel (x context-parallel) group hold the same dense weights, and those of an
expert-data-parallel group the same expert weights. Saves had the group's first rank write all of them
(ZAYA1-base: 33 GiB in fp32 from rank 0, against ~100 MB of optimizer state from every other rank), and
loads had every rank read all of them (at 1,024 data-parallel ranks, 1,024 reads of the whole model from
the same few files at every restart). `assign_owners` splits each tensor larger than the group's even
share (its bytes over its ranks, at least MIN_SHARE_BYTES) into row shares and gives each share one owner,
spreading the bytes evenly (ZAYA1-base's 2 GiB embedding would otherwise be one rank's, 62 times the even
share at 1,024 ranks): the owner alone writes its rows (state.model_entries), and at a load it reads them
and a broadcast over the group hands them to the others (`SharedReads`, in state.load_model, and
state.load_optimizer for optimizer state that is replicated without ZeRO-1). Every rank of a group assigns
alike: the same tensors, in the same order.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import torch

from megatron_zaya.checkpoint.blocks import narrow_ranges, ranges_shape
from megatron_zaya.checkpoint.format import DTYPE_NAMES, CheckpointError

MIN_SHARE_BYTES = 16 << 20     # smaller tensors stay whole: fewer entries and broadcasts for small models


@dataclass(frozen=True)
class Share:
    """Rows a..b (along dimension 0 of this rank's tensor; None: all of it) and the global rank in
    `group` that writes and reads them."""
    rows: tuple[int, int] | None
    group: object
    owner: int


def replica_group(pstate, is_expert: bool):
    """(process group, its global ranks) of the ranks holding the same slice of a tensor (an expert's or
    not), or None alone."""
    if pstate is None:
        return None
    kind = "expert_dp" if is_expert else "dp_cp"
    group, ranks = getattr(pstate, f"{kind}_group"), getattr(pstate, f"{kind}_ranks")
    return (group, ranks) if group is not None and len(ranks) > 1 else None


def row_shares(t: torch.Tensor, share_bytes: int) -> list[tuple[int, int] | None]:
    """`t`'s rows in about equal runs of at most `share_bytes` (one run of rows at the least); [None]
    for a tensor that fits, or one without rows."""
    nbytes = t.numel() * t.element_size()
    if t.dim() == 0 or nbytes <= share_bytes:
        return [None]
    count = min(t.shape[0], math.ceil(nbytes / share_bytes))
    return [(i * t.shape[0] // count, (i + 1) * t.shape[0] // count) for i in range(count)]


def assign_owners(tensors: dict[str, torch.Tensor], pstate, is_expert) -> dict[str, list[Share] | None]:
    """name -> the Shares of a replicated tensor (in row order), None for one this rank holds alone. A
    tensor over its group's even share is split in row shares; the shares, largest first, each go to the
    member of the group with the fewest bytes so far (the first on a tie)."""
    groups = {name: replica_group(pstate, is_expert(t)) for name, t in tensors.items()}
    keys = {name: tuple(found[1]) for name, found in groups.items() if found is not None}
    totals: dict[tuple, int] = {}
    for name, key in keys.items():
        totals[key] = totals.get(key, 0) + tensors[name].numel() * tensors[name].element_size()
    shares = []                  # (-bytes, position, name, rows): the largest first, then in order
    for name, key in keys.items():
        t = tensors[name]
        for rows in row_shares(t, max(MIN_SHARE_BYTES, math.ceil(totals[key] / len(key)))):
            count = t.numel() if rows is None else t[0].numel() * (rows[1] - rows[0])
            shares.append((-count * t.element_size(), len(shares), name, rows))
    heaps = {key: [(0, member) for member in range(len(key))] for key in totals}   # (bytes so far, member)
    out = {name: None if found is None else [] for name, found in groups.items()}
    members: dict[str, set[int]] = {name: set() for name in keys}   # those holding a share of the tensor
    for negative_bytes, _, name, rows in sorted(shares):
        heap, skipped = heaps[keys[name]], []
        while heap[0][1] in members[name]:      # one share of a tensor per rank (one entry per tensor in a
            skipped.append(heapq.heappop(heap))   # rank file; a tensor has no more shares than its group ranks)
        load, member = heapq.heappop(heap)
        for item in skipped + [(load - negative_bytes, member)]:
            heapq.heappush(heap, item)
        members[name].add(member)
        out[name].append(Share(rows, groups[name][0], keys[name][member]))
    for found in out.values():         # each tensor's shares in row order
        if found:
            found.sort(key=lambda share: (share.rows or (0, 0))[0])
    return out


def rows_of(shares: list[Share] | None, rank: int) -> list[tuple[int, int] | None]:
    """The rows this rank writes of a tensor with these shares ([None]: all of it, held alone)."""
    return [None] if shares is None else [s.rows for s in shares if s.owner == rank]


def select_rows(t: torch.Tensor, rows: tuple[int, int] | None) -> torch.Tensor:
    return t if rows is None else t[rows[0]:rows[1]]


class SharedReads:
    """Reads of checkpoint tensors that a group of ranks holds alike: each share read by its owner and
    broadcast over the group (`shares` None: read here). A failed read is kept, the broadcasts still made
    (with what the rank had), and `finish()`, on every rank, raises on all of them: CheckpointError with
    this rank's error or a pointer to the rank that failed."""

    def __init__(self, folder, pstate):
        self.folder, self.pstate = folder, pstate
        self.rank = pstate.rank if pstate is not None else 0
        self.error: Exception | None = None

    def _read(self, key: str, ranges, cache: dict) -> torch.Tensor | None:
        if self.error is not None:
            return None
        try:
            return self.folder.piece(key, ranges, None, cache)
        except (CheckpointError, OSError) as err:       # the group waits in the broadcast: agreed in finish
            self.error = err
            return None

    def _fill(self, t: torch.Tensor, key: str, ranges, cache: dict, shares: list[Share] | None) -> None:
        for share in [Share(None, None, self.rank)] if shares is None else shares:
            rows = select_rows(t, share.rows)
            if share.owner == self.rank:
                piece = self._read(key, narrow_ranges(ranges, share.rows), cache)
                if piece is not None:
                    rows.copy_(piece.to(t.dtype))
            if shares is not None:             # rows of a contiguous tensor: contiguous
                torch.distributed.broadcast(rows, src=share.owner, group=share.group)

    def into(self, t: torch.Tensor, key: str, ranges, cache: dict, shares: list[Share] | None) -> None:
        """Copy the checkpoint's block `ranges` of `key` into `t` (this rank's slice, in its dtype)."""
        target = t if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)
        self._fill(target, key, ranges, cache, shares)
        if target is not t:
            t.copy_(target)

    def new(self, key: str, ranges, cache: dict, shares: list[Share] | None, device) -> torch.Tensor:
        """The checkpoint's block `ranges` of `key`, as saved (its dtype; on `device` when shared)."""
        if shares is None:
            piece = self._read(key, ranges, cache)
            if piece is not None:
                return piece
        out = torch.empty(ranges_shape(ranges), dtype=DTYPE_NAMES[self.folder.index[key][0][1]["dtype"]],
                          device=device if shares is not None else "cpu")
        self._fill(out, key, ranges, cache, shares)
        return out

    def whole_tensors(self, select) -> dict[str, torch.Tensor]:
        """The checkpoint's small tensors that every rank needs whole (`select(key, entry)`: optimizer step
        counts, one per parameter and state, in the files of the ranks that wrote its state; the balancing-
        bias state in rank 0's), read once across the ranks: each reads those in its share of the rank
        files (the share it checked at the open: TrainingCheckpointer.open_for_load) and the ranks exchange
        them, instead of every rank opening every file that holds one. Whole entries only (saved unsplit).
        A failed read is kept for `finish`; its tensors are then missing."""
        group = self.pstate.world_group if self.pstate is not None else None
        world = self.pstate.world_size if group is not None else 1
        found: dict[str, torch.Tensor] = {}
        for rf in self.folder.ranks[self.rank % world::world]:
            for key, desc in rf.meta["entries"].items():
                whole = desc["flat"] is None and desc["ranges"] == [[[0, n]] for n in desc["shape"]]
                if whole and key not in found and self.error is None and select(key, desc):
                    try:
                        found[key] = rf.get(key).view(desc["shape"])
                    except (CheckpointError, OSError) as err:
                        self.error = err
        if world == 1:
            return found
        shares: list = [None] * world
        torch.distributed.all_gather_object(shares, found, group=group)
        merged: dict[str, torch.Tensor] = {}
        for share in shares:
            for key, value in share.items():
                merged.setdefault(key, value)
        return merged

    def finish(self, device) -> None:
        failed = torch.tensor([0.0 if self.error is None else 1.0], device=device)
        if self.pstate is not None and self.pstate.world_group is not None:
            torch.distributed.all_reduce(failed, op=torch.distributed.ReduceOp.MAX, group=self.pstate.world_group)
        if self.error is not None:
            raise CheckpointError(str(self.error)) from self.error
        if failed.item():
            raise CheckpointError("another rank could not read its share of the checkpoint (see its error)")
