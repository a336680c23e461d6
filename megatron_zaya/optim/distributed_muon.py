"""Muon in the ZeRO-1 layout: each whole matrix has one owner rank in its gradient group.

Per step (after the GradientReducer's reduce-scatter and the global clip):
  1. each bucket holding Muon matrices sends every owner the pieces of its matrices that the other
     ranks' reduced shards hold (one all_to_all_single with uneven splits per bucket), so the owner
     of a matrix sees the matrix's full summed gradient. Each rank receives about 1/N of the bucket,
     where an all-gather would bring all of it to every rank;
  2. each owner runs momentum + Newton-Schulz for ITS matrices only (batched by shape) and updates
     them; the momentum buffers live only on the owner (sharded optimizer state);
  3. the updated matrices go back the way their gradients came: each owner sends every rank the
     pieces of its matrices that lie in that rank's shard (one all_to_all_single per bucket), then
     the bucket is all-gathered from the shards (all_gather_into_tensor, as ZeRO-1 gathers AdamW's
     buckets). Two collectives per bucket, however many matrices it holds; a broadcast per matrix
     would be 440 collectives a step for ZAYA1-base (its Muon weights: 11 per block, experts stacked).
Weights stored in bf16 (--bf16 under ZeRO-1) get an fp32 master on their owner, kept with the
momentum (sharded like it): the update applies to the master, which is rounded into the weight.
Owners come from `owners_of_bucket` (largest first to the least-loaded rank), so the Newton-Schulz
work is spread evenly. Dense matrices use the DP x CP group, expert matrices the expert-DP group.
Owners are chosen from the whole (TP-unsplit) sizes in parameter order, so under TP the ranks of
one TP group own the slices of the same matrices; with `tp_group` (--muon-tp-mode duplicated) they
gather them and orthogonalise whole matrices (megatron_zaya/optim/muon_tp.py).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from megatron_zaya.optim.distributed import describe_sharding, sharding_report
from megatron_zaya.optim.muon import MuonScale, apply_update, momentum_direction, tp_orthogonalized_updates
from megatron_zaya.optim.muon_tp import whole_numel
from megatron_zaya.parallel.collectives import all_gather_single
from megatron_zaya.parallel.data import owners_of_bucket, shard_range


def _exchange(sends, receives, read, like: torch.Tensor, group) -> torch.Tensor:
    """One all_to_all_single with uneven splits: to rank q the pieces `read(i, a, b)` of sends[q], in
    order; returns what arrives, rank by rank in the order of `receives` (same (i, a, b) lists)."""
    send_sizes = [sum(b - a for _, a, b in ranges) for ranges in sends]
    recv_sizes = [sum(b - a for _, a, b in ranges) for ranges in receives]
    pieces = [read(i, a, b) for ranges in sends for i, a, b in ranges]
    out = torch.cat(pieces).to(like.dtype) if pieces else like.new_empty(0)
    got = like.new_empty(sum(recv_sizes))
    dist.all_to_all_single(got, out, recv_sizes, send_sizes, group=group)
    return got


class DistributedMuon:
    def __init__(self, params: list[torch.nn.Parameter], reducer, lr: float, momentum: float = 0.95,
                 nesterov: bool = True, weight_decay: float = 0.0, ns_steps: int = 5,
                 ns_dtype: torch.dtype | None = None, tp_group=None, scale: MuonScale = MuonScale()):
        self.param_groups = [dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                                  ns_steps=ns_steps, ns_dtype=ns_dtype, params=list(params))]
        self.reducer, self.tp_group, self.scale = reducer, tp_group, scale
        order = {p: n for n, p in enumerate(params)}
        wanted = set(params)
        self.buckets = [b for b in reducer.buckets if any(p in wanted for p in b.params)]
        self.owner: dict[torch.nn.Parameter, tuple] = {}   # param -> (bucket, index, owner group rank)
        by_group: dict = {}
        for bucket in self.buckets:
            for i, p in enumerate(bucket.params):
                if p in wanted:
                    by_group.setdefault(id(bucket.group), []).append((bucket, i, p))
        for members in by_group.values():
            members.sort(key=lambda member: order[member[2]])
            size = members[0][0].size
            owners = owners_of_bucket([whole_numel(p) for _, _, p in members], size)
            for (bucket, i, p), owner in zip(members, owners):
                self.owner[p] = (bucket, i, owner)
        self.state: dict[torch.nn.Parameter, dict] = {}
        self._plans: dict[int, list] = {}

    def _exchange_plan(self, bucket) -> list[list[list[tuple[int, int, int]]]]:
        """plans[q][r]: (parameter index in the bucket, buffer start, buffer end), in order, of the
        pieces of rank r's Muon matrices that lie in rank q's reduced shard. Gradients: rank q sends
        plans[q][r] to r and receives plans[r][q]; updated weights go the other way. Cached."""
        plans = self._plans.get(id(bucket))
        if plans is None:
            total, size = bucket.buffer.numel(), bucket.size
            plans = []
            for q in range(size):
                lo, hi = shard_range(total, size, q)
                plan = [[] for _ in range(size)]
                for i, p in enumerate(bucket.params):
                    if p not in self.owner:
                        continue
                    a, b = max(lo, bucket.offsets[i]), min(hi, bucket.offsets[i] + p.numel())
                    if a < b:
                        plan[self.owner[p][2]].append((i, a, b))
                plans.append(plan)
            self._plans[id(bucket)] = plans
        return plans

    def _gradients_to_owners(self, bucket) -> None:
        """Complete the summed gradient of every matrix this rank owns in the bucket's buffer (the
        reduce-scatter left each rank one contiguous shard of it)."""
        if bucket.size == 1:
            return
        plans, me = self._exchange_plan(bucket), bucket.rank
        sends, receives = plans[me], [plans[q][me] for q in range(bucket.size)]
        buffer = bucket.buffer
        got = _exchange(sends, receives, lambda i, a, b: buffer[a:b], buffer, bucket.group)
        at = 0
        for ranges in receives:
            for _, a, b in ranges:
                buffer[a:b].copy_(got[at:at + b - a])
                at += b - a

    def _weights_from_owners(self, bucket) -> None:
        """Every rank of the bucket's group gets the owners' updated Muon matrices: each shard holder
        first receives, from the owners, the pieces in its shard (the reverse of
        _gradients_to_owners), then the bucket's shards are all-gathered. Other parameters sharing
        the bucket are left as they are (their optimizer gathers them)."""
        if bucket.size == 1:
            return
        plans, me = self._exchange_plan(bucket), bucket.rank
        sends, receives = [plans[q][me] for q in range(bucket.size)], plans[me]
        matrices = [i for i, p in enumerate(bucket.params) if p in self.owner]
        dtype = bucket.params[matrices[0]].dtype
        if any(bucket.params[i].dtype != dtype for i in matrices):
            raise ValueError("DistributedMuon: a bucket mixes weight dtypes (bucket_key must separate them)")

        def piece(i, a, b):    # buffer range [a, b) of parameter i, read from the (updated) weight
            start = bucket.offsets[i]
            return bucket.params[i].detach().reshape(-1)[a - start:b - start]

        template = bucket.buffer.new_empty(0, dtype=dtype)
        got = _exchange(sends, receives, piece, template, bucket.group)
        lo, hi = bucket.owned
        shard = torch.zeros(hi - lo, dtype=dtype, device=template.device)
        at = 0
        for ranges in receives:
            for _, a, b in ranges:
                shard[a - lo:b - lo].copy_(got[at:at + b - a])
                at += b - a
        full = torch.empty(bucket.buffer.numel(), dtype=dtype, device=template.device)
        all_gather_single(full, shard, group=bucket.group)
        for i in matrices:
            p = bucket.params[i]
            p.detach().copy_(full[bucket.offsets[i]:bucket.offsets[i] + p.numel()].view_as(p))

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        for bucket in self.buckets:
            self._gradients_to_owners(bucket)
        index = {p: n for n, p in enumerate(group["params"])}
        mine = sorted((p for p, (bucket, _, owner) in self.owner.items() if owner == bucket.rank), key=index.get)
        directions = []
        for p in mine:
            bucket, i, _ = self.owner[p]
            state = self.state.setdefault(p, {})
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, dtype=torch.float32)
            if p.dtype != torch.float32 and "master" not in state:
                state["master"] = p.detach().float()
            directions.append(momentum_direction(bucket.view(i).float(), state["momentum_buffer"],
                                                 group["momentum"], group["nesterov"]))
        updates = tp_orthogonalized_updates(mine, directions, self.tp_group, group["ns_steps"], group["ns_dtype"],
                                            self.scale)
        for p, update in zip(mine, updates):
            master = self.state[p].get("master")
            apply_update(p if master is None else master, update, group["lr"], group["weight_decay"])
            if master is not None:
                p.copy_(master)
        for bucket in self.buckets:
            self._weights_from_owners(bucket)

    # -- memory (the same report as DistributedOptimizer's) ---------------------------------------
    def memory_report(self, state_bytes_per_param: int = 4) -> dict:
        """Bytes on this rank of Muon's state (one fp32 momentum per element of the matrices it owns,
        and an fp32 master where the weights are bf16) against an unsharded Muon holding every matrix's.
        Measured once the buffers exist (after a step), else `state_bytes_per_param` per element."""
        mine = [p for p, (bucket, _, owner) in self.owner.items() if owner == bucket.rank]
        owned = sum(p.numel() for p in mine)
        total = sum(p.numel() for p in self.owner)
        measured = sum(t.numel() * t.element_size() for s in self.state.values() for t in s.values())
        if not measured:     # estimate: the momentum, and the master of a weight that is not fp32
            measured = sum(p.numel() * (state_bytes_per_param + (4 if p.dtype != torch.float32 else 0)) for p in mine)
        per_param = measured / owned if owned else state_bytes_per_param
        return sharding_report(owned, total, per_param)

    def describe_memory(self) -> str:
        return describe_sharding("distributed Muon momentum", self.memory_report())

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass   # gradients live in the reducer's buckets, cleared by the reducer

    def owned_masters(self) -> dict:
        """As DistributedOptimizer.owned_masters: a weight stored below fp32 has its whole master on its
        owner (before the first step, which makes it, the weight is its value) and none elsewhere."""
        masters = {}
        for p, (bucket, _, owner) in self.owner.items():
            if p.dtype != torch.float32:
                master = self.state.get(p, {}).get("master", p.detach()) if owner == bucket.rank else None
                masters[p] = [] if master is None else [(0, p.numel(), master.reshape(-1))]
        return masters

    def state_dict(self) -> dict:
        """Momentum (and fp32 master, for bf16 weights) of the matrices this rank owns, keyed by their
        position in the parameter list."""
        index = {p: n for n, p in enumerate(self.param_groups[0]["params"])}
        return {"momentum": {index[p]: s["momentum_buffer"].clone() for p, s in self.state.items()},
                "master": {index[p]: s["master"].clone() for p, s in self.state.items() if "master" in s},
                "lr": self.param_groups[0]["lr"]}

    def load_state_dict(self, state: dict) -> None:
        params = self.param_groups[0]["params"]
        self.state = {params[int(n)]: {"momentum_buffer": t.clone()} for n, t in state["momentum"].items()}
        for n, t in state.get("master", {}).items():
            self.state[params[int(n)]]["master"] = t.clone()
