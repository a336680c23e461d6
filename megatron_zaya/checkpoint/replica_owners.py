"""One owner per replicated model tensor in its replica group: the rank that writes it at a save and reads
it at a load (what Megatron-LM's --ckpt-fully-parallel-save / -load do for replicas).

The ranks of a data-parallel (x context-parallel) group hold the same dense weights, and those of an
expert-data-parallel group the same expert weights. Saves had the group's first rank write all of them
(ZAYA1-base: 33 GiB in fp32 from rank 0, against ~100 MB of optimizer state from every other rank), and
loads had every rank read all of them (at 1,024 data-parallel ranks, 1,024 reads of the whole model from
the same few files at every restart). `assign_owners` gives each tensor one owner in its group, spreading
the bytes evenly: it alone writes the tensor (state.writes_replica), and at a load it reads it and a
broadcast over the group hands it to the others (state.load_model). Every rank of a group assigns alike:
the same tensors, in the same order.
"""
from __future__ import annotations

import torch

from megatron_zaya.checkpoint.format import CheckpointError


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


def agree_no_failure(error: Exception | None, pstate, device) -> None:
    """Raise on every rank when any rank failed to read its share (the others waited in the broadcasts;
    it broadcast what it had): CheckpointError with this rank's error or a pointer to the other's."""
    failed = torch.tensor([0.0 if error is None else 1.0], device=device)
    if pstate is not None and pstate.world_group is not None:
        torch.distributed.all_reduce(failed, op=torch.distributed.ReduceOp.MAX, group=pstate.world_group)
    if error is not None:
        raise CheckpointError(str(error)) from error
    if failed.item():
        raise CheckpointError("another rank could not read its share of the model weights (see its error)")
