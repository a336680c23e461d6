"""One owner per replicated model tensor in its replica group: the rank that writes it at a save and reads
it at a load (what Megatron-LM's --ckpt-fully-parallel-save / -load do for replicas).

The ranks of a data-parallel (x context-parallel) group hold the same dense weights, and those of an
expert-data-parallel group the same expert weights. Saves had the group's first rank write all of them
(ZAYA1-base: 33 GiB in fp32 from rank 0, against ~100 MB of optimizer state from every other rank), and
loads had every rank read all of them (at 1,024 data-parallel ranks, 1,024 reads of the whole model from
the same few files at every restart). `assign_owners` gives each tensor one owner in its group, spreading
the bytes evenly: it alone writes the tensor (state.writes_replica), and at a load it reads it and a
broadcast over the group hands it to the others (`SharedReads`, in state.load_model, and state.load_optimizer
for optimizer state that is replicated without ZeRO-1). Every rank of a group assigns alike: the same
tensors, in the same order.
"""
from __future__ import annotations

import torch

from megatron_zaya.checkpoint.format import DTYPE_NAMES, CheckpointError, ranges_shape


def replica_group(t: torch.Tensor, pstate, is_expert: bool):
    """(process group, its global ranks) of the ranks holding the same slice of `t`, or None alone."""
    if pstate is None:
        return None
    kind = "expert_dp" if is_expert else "dp_cp"
    group, ranks = getattr(pstate, f"{kind}_group"), getattr(pstate, f"{kind}_ranks")
    return (group, ranks) if group is not None and len(ranks) > 1 else None


def assign_owners(tensors: dict[str, torch.Tensor], pstate, is_expert) -> dict[str, tuple | None]:
    """name -> (group, global rank of its owner) for every replicated tensor, None for one this rank
    holds alone. Owners are chosen tensor by tensor: the member of the group with the fewest bytes so
    far (the first on a tie)."""
    loads: dict[tuple, list[int]] = {}
    out = {}
    for name, t in tensors.items():
        found = replica_group(t, pstate, is_expert(t))
        if found is None:
            out[name] = None
            continue
        group, ranks = found
        load = loads.setdefault(tuple(ranks), [0] * len(ranks))
        member = load.index(min(load))
        load[member] += t.numel() * t.element_size()
        out[name] = (group, ranks[member])
    return out


class SharedReads:
    """Reads of checkpoint tensors that a group of ranks holds alike: each read by its owner and broadcast
    over the owner's group (`owner` None: read here). A failed read is kept, the broadcast still made (with
    what the rank had), and `finish()`, on every rank, raises on all of them: CheckpointError with this
    rank's error or a pointer to the rank that failed."""

    def __init__(self, folder, pstate):
        self.folder, self.pstate = folder, pstate
        self.rank = pstate.rank if pstate is not None else 0
        self.error: Exception | None = None

    def _read(self, key: str, ranges, cache: dict, owner) -> torch.Tensor | None:
        if self.error is not None or (owner is not None and owner[1] != self.rank):
            return None
        try:
            return self.folder.piece(key, ranges, None, cache)
        except (CheckpointError, OSError) as err:       # the group waits in the broadcast: agreed in finish
            self.error = err
            return None

    def into(self, t: torch.Tensor, key: str, ranges, cache: dict, owner) -> None:
        """Copy the checkpoint's block `ranges` of `key` into `t` (this rank's slice, in its dtype)."""
        piece = self._read(key, ranges, cache, owner)
        if piece is not None:
            t.copy_(piece.to(t.dtype))
        if owner is not None:
            shared = t if t.is_contiguous() else t.contiguous()
            torch.distributed.broadcast(shared, src=owner[1], group=owner[0])
            if shared is not t:
                t.copy_(shared)

    def new(self, key: str, ranges, cache: dict, owner, device) -> torch.Tensor:
        """The checkpoint's block `ranges` of `key`, as saved (its dtype; on `device` when shared)."""
        piece = self._read(key, ranges, cache, owner)
        if piece is None:        # another rank's to read, or a failed read (finish raises): a buffer for it
            piece = torch.empty(ranges_shape(ranges), dtype=DTYPE_NAMES[self.folder.index[key][0][1]["dtype"]],
                                device=device if owner is not None else "cpu")
        if owner is None:
            return piece
        shared = piece.to(device).contiguous()
        torch.distributed.broadcast(shared, src=owner[1], group=owner[0])
        return shared

    def finish(self, device) -> None:
        failed = torch.tensor([0.0 if self.error is None else 1.0], device=device)
        if self.pstate is not None and self.pstate.world_group is not None:
            torch.distributed.all_reduce(failed, op=torch.distributed.ReduceOp.MAX, group=self.pstate.world_group)
        if self.error is not None:
            raise CheckpointError(str(self.error)) from self.error
        if failed.item():
            raise CheckpointError("another rank could not read its share of the checkpoint (see its error)")
