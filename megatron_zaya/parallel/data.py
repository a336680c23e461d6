"""Data-parallel gradient reduction in buckets that overlap with the backward pass, and the global
gradient-norm clip.

Averaging convention: gradients are SUMMED over the reduction group (average=False, the default).
The training loop divides each rank's loss by the GLOBAL number of loss tokens, so the sum over
ranks is exactly the gradient of the global mean loss - the number one process gets on the whole
batch. (average=True divides by the group size instead: Megatron's convention when each rank's
loss is its local mean.)

Groups: dense parameters over DP x CP (`pstate.dp_cp_group`); expert parameters (`param.is_expert`)
over expert-DP (`pstate.expert_dp_group`); under sequence parallelism the replicated parameters
that see only S/TP tokens per rank (`param.sequence_parallel`: norms, scalings, router) over the
whole world (TP x DP x CP), which sums their TP-partial gradients in the same collective. Under ZeRO-1 (shard=True) each bucket is one flat buffer
reduce-scattered: rank r of the group receives the summed gradients of the contiguous element range
it owns (`shard_range`, Megatron's split).

After `finish()`: without sharding every parameter has `param.main_grad` (fp32, a view into the
bucket) and, when the dtypes agree, `param.grad` on the same memory; under ZeRO-1 a parameter has
`param.main_grad_shard = (start, flat view)` for the piece this rank owns (None elsewhere).
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable

import torch
import torch.distributed as dist

from megatron_zaya.parallel.collectives import reduce_scatter_single
from megatron_zaya.parallel.mappings import group_size


def is_expert(param) -> bool:
    return getattr(param, "is_expert", False)


def reduction_kind(param) -> str:
    """"expert" (reduced over expert-DP), "sequence_parallel" (replicated but fed S/TP different
    tokens per TP rank: reduced over TP x DP x CP = the world) or "dense" (over DP x CP)."""
    if is_expert(param):
        return "expert"
    return "sequence_parallel" if getattr(param, "sequence_parallel", False) else "dense"


def shard_range(total: int, num_ranks: int, rank: int) -> tuple[int, int]:
    """ZeRO-1 ownership of a (padded) bucket of `total` elements: rank r owns the contiguous
    elements [r * total / N, (r + 1) * total / N) - balanced to the element; a parameter may straddle
    two owners (fine for element-wise optimizers such as AdamW)."""
    size = total // num_ranks
    return rank * size, (rank + 1) * size


def owners_of_bucket(numels: list[int], num_ranks: int) -> list[int]:
    """Whole-parameter owners (largest first, each to the least-loaded rank): the assignment a
    distributed Muon needs (whole matrices per owner). Not used by the element-wise ZeRO-1 path."""
    load = [0] * num_ranks
    owners = [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: -numels[i]):
        r = min(range(num_ranks), key=lambda r: load[r])
        owners[i] = r
        load[r] += numels[i]
    return owners


class Bucket:
    """Parameters back to back in one flat gradient buffer (padded to a multiple of the group size
    when sharded), reduced with one collective."""

    def __init__(self, params: list, group, shard: bool, dtype: torch.dtype, device):
        self.params, self.group, self.shard = params, group, shard
        self.size = group_size(group)
        self.rank = dist.get_rank(group) if self.size > 1 else 0
        numels = [p.numel() for p in params]
        self.offsets = [sum(numels[:i]) for i in range(len(params))]
        total = sum(numels)
        if shard:
            total = -(-total // self.size) * self.size
        self.buffer = torch.zeros(total, dtype=dtype, device=device)
        self.owned = shard_range(total, self.size, self.rank) if shard else (0, total)
        self.ready = 0
        self.work = None
        self.reduced = None

    def view(self, i: int) -> torch.Tensor:
        p = self.params[i]
        return self.buffer[self.offsets[i]:self.offsets[i] + p.numel()].view(p.shape)

    def owned_pieces(self):
        """(param index, start, end) within the flattened parameter, for every piece this rank owns."""
        lo, hi = self.owned
        for i, p in enumerate(self.params):
            a, b = max(lo, self.offsets[i]), min(hi, self.offsets[i] + p.numel())
            if a < b:
                yield i, a - self.offsets[i], b - self.offsets[i]

    def launch(self, average: bool) -> None:
        if self.work is not None or self.size == 1:
            return
        if average:
            self.buffer.div_(self.size)
        if self.shard:
            self.reduced = self.buffer.new_empty(self.owned[1] - self.owned[0])
            self.work = reduce_scatter_single(self.reduced, self.buffer, group=self.group, async_op=True)
        else:
            self.work = dist.all_reduce(self.buffer, group=self.group, async_op=True)

    def wait(self) -> None:
        if self.work is not None:
            self.work.wait()
            if self.shard:
                self.buffer[self.owned[0]:self.owned[1]].copy_(self.reduced)
                self.reduced = None
        self.work = None
        self.ready = 0


DEFAULT_BUCKET_SIZE = 40_000_000      # --ddp-bucket-size's default, in gradient elements


def bucket_size_for(params, num_buckets: int) -> int:
    """--ddp-num-buckets: the bucket size (elements) that splits these parameters' gradients into about
    `num_buckets` buckets (each kind of reduction is bucketed apart, so a few more can result)."""
    total = sum(p.numel() for p in params if p.requires_grad)
    return max(1, -(-total // num_buckets))


class GradientReducer:
    """Bucketed gradient reduction, each bucket launched (async) as soon as its last gradient is
    accumulated during backward.

    Per step: `with reducer.no_sync():` around all micro-batches but the last, backward of the last,
    `reducer.finish()` before clipping / the optimizer, then `reducer.zero_grad()`.
    Buckets are launched in the order their last gradient arrives, so every rank of a group must
    produce gradients for the same parameters (true for this model: every weight takes part in
    every forward, experts included, even with no tokens)."""

    def __init__(self, params_or_module, pstate, bucket_size: int = 40_000_000, overlap: bool = True,
                 shard: bool = False, average: bool = False, grad_dtype: torch.dtype = torch.float32,
                 bucket_key: Callable[[torch.nn.Parameter], object] | None = None):
        """bucket_key: parameters with different keys never share a bucket (ZeRO-1 with Muon: the
        matrices that DistributedMuon updates on their owners apart from what the AdamW shards all-gather)."""
        params = list(params_or_module.parameters()) if isinstance(params_or_module, torch.nn.Module) \
            else list(params_or_module)
        params = [p for p in params if p.requires_grad]
        self.pstate, self.overlap, self.shard, self.average = pstate, overlap, shard, average
        self.sync = True
        self.buckets: list[Bucket] = []
        self.where: dict[torch.nn.Parameter, tuple[Bucket, int]] = {}
        # Reverse registration order ~ the order gradients become ready in backward.
        for kind, group in (("dense", pstate.dp_cp_group), ("sequence_parallel", pstate.world_group),
                            ("expert", pstate.expert_dp_group)):
            of_kind = [p for p in reversed(params) if reduction_kind(p) == kind]
            keys = list(dict.fromkeys(bucket_key(p) for p in of_kind)) if bucket_key else [None]
            for key in keys:
                chosen = [p for p in of_kind if bucket_key is None or bucket_key(p) == key]
                while chosen:
                    take, total = [], 0
                    while chosen and (not take or total + chosen[0].numel() <= bucket_size):
                        total += chosen[0].numel()
                        take.append(chosen.pop(0))
                    bucket = Bucket(take, group, shard, grad_dtype, take[0].device)
                    self.buckets.append(bucket)
                    for i, p in enumerate(take):
                        self.where[p] = (bucket, i)
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self.where]

    def _on_grad(self, param) -> None:
        bucket, i = self.where[param]
        bucket.view(i).add_(param.grad)
        param.grad = None
        if self.sync:
            bucket.ready += 1
            if self.overlap and bucket.ready == len(bucket.params):
                bucket.launch(self.average)

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally (micro-batches before the last); no communication."""
        previous, self.sync = self.sync, False
        try:
            yield
        finally:
            self.sync = previous

    def finish(self) -> None:
        """Wait for every bucket's reduction (launching those not launched yet) and expose the
        reduced gradients (see the module docstring)."""
        for bucket in self.buckets:
            bucket.launch(self.average)
        for bucket in self.buckets:
            bucket.wait()
            if bucket.shard:
                for p in bucket.params:
                    p.main_grad, p.grad, p.main_grad_shard = None, None, None
                for i, a, b in bucket.owned_pieces():
                    o = bucket.offsets[i]
                    bucket.params[i].main_grad_shard = (a, bucket.buffer[o + a:o + b])
                continue
            for i, p in enumerate(bucket.params):
                p.main_grad = bucket.view(i)
                p.grad = p.main_grad if p.main_grad.dtype == p.dtype else None

    def zero_grad(self) -> None:
        for bucket in self.buckets:
            bucket.buffer.zero_()
            bucket.ready = 0
        for p in self.where:
            p.grad, p.main_grad, p.main_grad_shard = None, None, None

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()


def _grad_and_counted(param, pstate):
    """(reduced gradient on this rank or None, whether this rank counts it in the global norm):
    every element of the global gradient is counted on exactly one rank."""
    counted = getattr(param, "tensor_model_parallel", False) or pstate.tp_rank == 0   # TP replicas: once
    shard = getattr(param, "main_grad_shard", None)
    if shard is not None:                  # ZeRO-1: this rank alone holds this piece in its group
        return shard[1], counted or reduction_kind(param) == "sequence_parallel"   # (that group spans TP)
    g = getattr(param, "main_grad", None)
    g = param.grad if g is None else g
    if g is None:
        return None, False
    group_rank = pstate.expert_dp_rank if is_expert(param) else pstate.dp_cp_rank
    return g, counted and group_rank == 0


def _replicated_part(param, g) -> torch.Tensor | None:
    """The elements of this rank's gradient piece g (flat) in rows of a TP slice that are replicas
    of another rank's rows (KV heads when TP > HKV, `param.tp_replicated_rows`), on every replica but
    the first, which counts them; None when there are none."""
    rows = getattr(param, "tp_replicated_rows", None)
    if rows is None or getattr(param, "tp_replica_primary", True) or param.numel() == 0:
        return None
    width = param.numel() // param.shape[0]
    lo, hi = rows[0] * width, rows[1] * width
    start = param.main_grad_shard[0] if getattr(param, "main_grad_shard", None) is not None else 0
    flat = g.reshape(-1)
    a, b = max(lo, start), min(hi, start + flat.numel())
    return flat[a - start:b - start] if a < b else None


def _replicated_square(param, g) -> torch.Tensor | float:
    part = _replicated_part(param, g)
    return 0.0 if part is None else sum_of_squares(part)


SQUARES_ROW = 4096


def sum_of_squares(t: torch.Tensor) -> torch.Tensor:
    """Sum of t's squared elements (fp32), accurate at any size: rows of SQUARES_ROW elements reduced
    by vector_norm in fp32, their squares summed in fp64. vector_norm over a whole large tensor
    accumulates naively on CPU: 0.4% off for zaya1-100m's 50M-element expert gradients, against 1e-8
    this way (and 3x faster than squaring into a temporary, which sums accurately)."""
    flat = t.reshape(-1)
    whole = flat.numel() // SQUARES_ROW * SQUARES_ROW
    total = flat[whole:].double().square().sum()
    if whole:
        rows = torch.linalg.vector_norm(flat[:whole].view(-1, SQUARES_ROW), dim=1,       # (fp64 stays fp64)
                                        dtype=torch.promote_types(flat.dtype, torch.float32))
        total = total + rows.double().square().sum()
    return total.float()


def count_zero_grads(params, pstate, device: torch.device) -> int:
    """How many elements of the reduced global gradient are exactly zero (Megatron-LM's
    --log-num-zeros-in-grad), each element counted on exactly one rank, as in clip_grad_norm.
    Call after `GradientReducer.finish()`; a collective over all ranks."""
    zeros = torch.zeros((), dtype=torch.int64, device=device)
    for p in params:
        g, counted = _grad_and_counted(p, pstate)
        if g is None or not counted:
            continue
        zeros += (g == 0).sum()
        part = _replicated_part(p, g)
        if part is not None:
            zeros -= (part == 0).sum()
    if pstate.world_size > 1:
        dist.all_reduce(zeros, group=pstate.world_group)
    return int(zeros.item())


def clip_grad_norm(params, max_norm: float | None, pstate) -> torch.Tensor:
    """Global L2 norm of the reduced gradients across TP / EP / DP / CP shards (replicas counted once,
    ZeRO-1 shards once), and in-place scaling by max_norm / norm when it is exceeded. Call after
    `GradientReducer.finish()`. max_norm None or <= 0: only the norm; a non-finite norm scales nothing.
    Returns the norm (fp32 tensor)."""
    pieces = []
    square = None
    for p in params:
        g, counted = _grad_and_counted(p, pstate)
        if g is None:
            continue
        pieces.append((g, counted))
        if square is None:
            square = torch.zeros((), dtype=torch.float32, device=g.device)
        if counted:
            square += sum_of_squares(g) - _replicated_square(p, g)
    if square is None:
        square = torch.zeros((), dtype=torch.float32)
    if pstate.world_size > 1:
        dist.all_reduce(square, group=pstate.world_group)
    norm = square.sqrt()
    if max_norm is not None and max_norm > 0 and math.isfinite(norm_value := norm.item()):
        coef = max_norm / (norm_value + 1e-6)   # non-finite: the gradients stay as they are, to be diagnosed
        if coef < 1.0:
            for g, _ in pieces:
                g.mul_(coef)
    return norm
