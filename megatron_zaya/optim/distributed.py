"""ZeRO-1 distributed optimizer, generic over an inner torch optimizer (AdamW, ...).

The GradientReducer (shard=True) lays each bucket's gradients out flat and reduce-scatters it, so
rank r of the reduction group receives the summed gradients of the contiguous element range it
owns (`megatron_zaya.parallel.data.shard_range`; DP x CP for dense parameters, expert-DP for expert
parameters). This optimizer keeps fp32 master weights and the inner optimizer's state for those
owned pieces only, steps them, writes them into the model's parameters and all-gathers each bucket's
parameters so every replica holds the new weights (Megatron's distributed optimizer). The master of
a piece of an fp32 weight is that piece itself (a view): only bf16 weights get fp32 copies.

Memory per rank for P parameters over N ranks with Adam: unsharded = 4P (fp32 master) + 8P (moments);
ZeRO-1 = (4P + 8P) / N (+ padding < N elements per bucket). `memory_report()` measures this rank.
"""
from __future__ import annotations

from typing import Callable

import torch

from megatron_zaya.parallel.collectives import all_gather_single
from megatron_zaya.parallel.data import GradientReducer


def sharding_report(owned: int, total: int, bytes_per_param: float) -> dict:
    """Per-rank state bytes of a sharded optimizer against the same state unsharded."""
    sharded, unsharded = int(owned * bytes_per_param), int(total * bytes_per_param)
    return {"params_total": total, "params_owned": owned, "sharded_bytes": sharded,
            "unsharded_bytes": unsharded, "saved_bytes": unsharded - sharded,
            "saved_fraction": 1 - sharded / unsharded if unsharded else 0.0}


def describe_sharding(what: str, report: dict) -> str:
    mib = 1 / 2 ** 20
    return (f"{what} {report['sharded_bytes'] * mib:.2f} MiB/rank instead of "
            f"{report['unsharded_bytes'] * mib:.2f} MiB (saves {100 * report['saved_fraction']:.0f}%)")


class DistributedOptimizer:
    def __init__(self, params_or_groups, optimizer_factory: Callable[[list[dict]], torch.optim.Optimizer],
                 pstate, reducer: GradientReducer | None = None, bucket_size: int = 40_000_000):
        groups = list(params_or_groups)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.pstate = pstate
        self.params = [p for g in groups for p in g["params"] if p.requires_grad]
        self.reducer = reducer or GradientReducer(self.params, pstate, bucket_size=bucket_size, shard=True)
        if not self.reducer.shard:
            raise ValueError("DistributedOptimizer needs a GradientReducer built with shard=True")
        group_of = {p: gi for gi, g in enumerate(groups) for p in g["params"]}
        # One fp32 master per owned piece: (param, start, end, master).
        self.pieces: list[tuple[torch.nn.Parameter, int, int, torch.nn.Parameter]] = []
        masters_by_group: list[list] = [[] for _ in groups]
        for bucket in self.reducer.buckets:
            for i, a, b in bucket.owned_pieces():
                p = bucket.params[i]
                if p not in group_of:
                    continue
                flat = p.detach().reshape(-1)[a:b]     # an fp32 weight's piece is its own master
                m = torch.nn.Parameter(flat if p.dtype == torch.float32 else flat.float().clone())
                self.pieces.append((p, a, b, m))
                masters_by_group[group_of[p]].append(m)
        inner_groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": ms}
                        for g, ms in zip(groups, masters_by_group) if ms]
        # A rank can own nothing (more ranks than elements): it then only takes part in the gathers.
        self.inner = optimizer_factory(inner_groups) if inner_groups else None
        # Buckets holding none of these parameters (e.g. only Muon matrices, which DistributedMuon
        # gathers itself) are not all-gathered here. The same on every rank of a group: the
        # buckets and the parameter split are.
        mine = set(self.params)
        self.gathered_buckets = [b for b in self.reducer.buckets if any(p in mine for p in b.params)]

    @property
    def param_groups(self):
        return self.inner.param_groups if self.inner is not None else []

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.reducer.zero_grad()
        for *_, m in self.pieces:
            m.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """Inner step on the owned masters (gradients: the reduced `main_grad_shard`), then all-gather.
        Call `reducer.finish()` (and clip_grad_norm) first."""
        for p, a, b, m in self.pieces:
            start, g = p.main_grad_shard
            m.grad = g[a - start:b - start].float()
        if self.inner is not None:
            self.inner.step()
        for p, a, b, m in self.pieces:
            if p.dtype != torch.float32:
                p.view(-1)[a:b].copy_(m)
        self.gather_params()

    @torch.no_grad()
    def gather_params(self) -> None:
        """The parameters of every bucket holding some of ours, all-gathered from their owners (same
        layout as the gradients)."""
        for bucket in self.gathered_buckets:
            if bucket.size == 1:
                continue
            dtype = bucket.params[0].dtype
            lo, hi = bucket.owned
            mine = torch.zeros(hi - lo, dtype=dtype, device=bucket.buffer.device)
            for i, a, b in bucket.owned_pieces():
                o = bucket.offsets[i] - lo
                mine[o + a:o + b].copy_(bucket.params[i].reshape(-1)[a:b])
            full = torch.empty(bucket.buffer.numel(), dtype=dtype, device=mine.device)
            all_gather_single(full, mine, group=bucket.group)
            for i, p in enumerate(bucket.params):
                p.copy_(full[bucket.offsets[i]:bucket.offsets[i] + p.numel()].view_as(p))

    def owned_masters(self) -> dict:
        """Each weight stored below fp32 (bf16 under --bf16): [(start, end, fp32 master)] of the pieces of the
        flat weight this rank owns (maybe none); the ranks of its gradient group hold all of it, once."""
        masters = {p: [] for p in self.params if p.dtype != torch.float32}
        for p, a, b, m in self.pieces:
            if p in masters:
                masters[p].append((a, b, m.detach()))
        return masters

    # -- checkpointing: one state per rank (its shard) --------------------------------------------
    def state_dict(self) -> dict:
        return {"inner": self.inner.state_dict() if self.inner is not None else None,
                "master": [m.detach().clone() for *_, m in self.pieces]}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        if self.inner is not None:
            self.inner.load_state_dict(state["inner"])
        for (p, a, b, m), saved in zip(self.pieces, state["master"]):
            m.copy_(saved)
            p.view(-1)[a:b].copy_(saved)
        self.gather_params()

    # -- memory -------------------------------------------------------------------------------------
    def memory_report(self, state_bytes_per_param: int = 8) -> dict:
        """Bytes on this rank of fp32 master weights (those of bf16 weights: an fp32 weight is its own)
        + optimizer state, against what an unsharded optimizer holds for the same parameters. State is
        measured when it exists (after a step), else estimated at `state_bytes_per_param` (8 for Adam's
        two fp32 moments)."""
        owned = sum(m.numel() for *_, m in self.pieces)
        total = sum(p.numel() for p in self.params)
        measured = 0
        if self.inner is not None:
            measured = sum(t.numel() * t.element_size() for *_, m in self.pieces
                           for t in self.inner.state.get(m, {}).values() if torch.is_tensor(t) and t.dim() > 0)
        masters = sum(4 * m.numel() for p, _, _, m in self.pieces if p.dtype != torch.float32)
        state = measured if measured else state_bytes_per_param * owned
        per_param = (masters + state) / owned if owned else state_bytes_per_param
        return sharding_report(owned, total, per_param)

    def describe_memory(self) -> str:
        return describe_sharding("ZeRO-1 master+optimizer state", self.memory_report())
