"""The training loop's process-layout interface (see runtime.SingleProcess) over several processes:
process groups from megatron_zaya.parallel, the parallel model, bucketed gradient reduction and,
with --use-distributed-optimizer, the ZeRO-1 optimizer.

Gradients are SUMMED across ranks (not averaged): the loop divides each rank's loss by the number of
loss tokens in the whole global batch, so the sum is exactly the single-process gradient."""
from __future__ import annotations

import contextlib
import hashlib
import math

import torch
import torch.distributed as dist

from megatron_zaya.parallel.apply import parallelize_model, sum_counts_over_token_ranks
from megatron_zaya.parallel.collectives import all_gather_single
from megatron_zaya.parallel.context import slice_batch_for_cp
from megatron_zaya.optim.builder import muon_bucket_key
from megatron_zaya.parallel.data import (GradientReducer, bucket_size_for, clip_grad_norm, count_zero_grads, is_expert,
                                        reduction_kind, sum_of_squares)
from megatron_zaya.parallel.launch import DEFAULT_TIMEOUT_MINUTES, destroy_distributed, init_distributed
from megatron_zaya.parallel.state import ParallelState
from megatron_zaya.training.runtime import place_on


class DistributedRuntime:
    gradient_average_factor = 1.0

    def __init__(self, run):
        self.run = run
        # A RunConfig built in code (bench/train_throughput.py) may carry a partial namespace.
        timeout = getattr(run.args, "distributed_timeout_minutes", DEFAULT_TIMEOUT_MINUTES)
        self.env = init_distributed(run.args.distributed_backend, timeout)
        self.rank, self.world_size, self.device = self.env.rank, self.env.world_size, self.env.device
        p = run.parallel
        self.pstate = ParallelState(p.tensor_model_parallel_size, p.context_parallel_size,
                                    p.expert_model_parallel_size, sequence_parallel=p.sequence_parallel,
                                    model_config=run.model)
        self.dp_rank, self.dp_size = self.pstate.dp_rank, self.pstate.dp_size
        self.is_main = self.rank == 0
        self.model = None
        self.reducer = None

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        # Split first (this rank's TP / EP slices), then onto the device: only the slices travel, and
        # a meta model (weights to be loaded) is allocated there, sliced, never on the host.
        self.model = place_on(parallelize_model(model, self.pstate), self.device)
        self.model.local_routing_counts = True     # reduced once per step: sum_routing_counts
        shard = self.run.parallel.use_distributed_optimizer
        key = None
        if shard:
            if self.run.train.bf16:    # Megatron's distributed optimizer: bf16 weights, fp32 masters in the shards
                self.model.store_weights_in(torch.bfloat16)
            muon = muon_bucket_key(self.model, self.run.optim)
            # No bucket mixes Muon matrices with AdamW parameters, nor dtypes (its weights are gathered
            # in one dtype).
            key = lambda p: (muon(p) if muon else None, p.dtype)   # noqa: E731
        parallel = self.run.parallel
        bucket_size = (parallel.ddp_bucket_size if parallel.ddp_num_buckets is None
                       else bucket_size_for(self.model.parameters(), parallel.ddp_num_buckets))
        self.reducer = GradientReducer(self.model, self.pstate, bucket_size=bucket_size, overlap=True, shard=shard,
                                       bucket_key=key)
        return self.model

    def build_optimizer(self, model, optim_config):
        from megatron_zaya.optim.builder import build_distributed_optimizer, build_optimizer
        tp = self.run.parallel.tensor_model_parallel_size
        if optim_config.optimizer == "muon" and optim_config.muon_tp_mode == "blockwise" and tp > 1 and self.is_main:
            print(f"warning: --muon-tp-mode blockwise with --tensor-model-parallel-size={tp} orthogonalises each "
                  f"rank's slice of a split matrix, not the whole matrix, so the update depends on the TP size; "
                  f"--muon-tp-mode duplicated (the default) orthogonalises whole matrices", flush=True)
        if self.run.parallel.use_distributed_optimizer:
            optimizer = build_distributed_optimizer(model, optim_config, self.pstate, self.reducer)
            self.log_optimizer_memory(optimizer)
            return optimizer
        return build_optimizer(model, optim_config, self.pstate)

    def log_optimizer_memory(self, optimizer) -> None:
        """Once, before the first step (state estimated: 8 B/param for Adam's moments + 4 B master,
        4 B for Muon's momentum): rank 0's report per optimizer, and the largest total over ranks
        (ranks differ: Muon owns whole matrices, and AdamW's elements of the shared buckets follow)."""
        reports = {name: opt.memory_report() for name, opt in optimizer.optimizers.items()}
        mine = torch.tensor([float(sum(r["sharded_bytes"] for r in reports.values()))], device=self.device)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        if self.is_main:
            mib = 1 / 2 ** 20
            unsharded = sum(r["unsharded_bytes"] for r in reports.values())
            parts = "; ".join(f"{name}: {opt.describe_memory()}" for name, opt in optimizer.optimizers.items())
            print(f"ZeRO-1 on rank 0: {parts}; in all {sum(r['sharded_bytes'] for r in reports.values()) * mib:.2f} "
                  f"MiB, at most {mine.item() * mib:.2f} MiB on any rank, instead of {unsharded * mib:.2f} MiB",
                  flush=True)

    # -- what the loop calls ----------------------------------------------------------------------
    def local_batch(self, batch: dict) -> dict:
        return slice_batch_for_cp(batch, self.pstate) if self.pstate.cp_size > 1 else batch

    def sum_over_data_ranks(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.to(self.device).clone()
        if self.pstate.dp_cp_size > 1:
            dist.all_reduce(tensor, group=self.pstate.dp_cp_group)
        return tensor

    def max_over_all_ranks(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.to(self.device).clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor

    def gather_from_all_ranks(self, value: float) -> list[float]:
        """`value` of every rank, in global rank order."""
        mine = torch.tensor([value], dtype=torch.float64, device=self.device)
        every = torch.empty(self.world_size, dtype=torch.float64, device=self.device)
        all_gather_single(every, mine)
        return every.tolist()

    def sum_routing_counts(self, counts: torch.Tensor) -> torch.Tensor:
        """The step's counts (summed over its micro-batches on this rank) summed over the ranks
        holding different tokens: one collective per step instead of one per forward."""
        return sum_counts_over_token_ranks(counts, self.pstate)

    def no_sync(self, skip: bool):
        return self.reducer.no_sync() if skip else contextlib.nullcontext()

    def zero_grad(self) -> None:
        self.reducer.zero_grad()

    def finish_gradient_reduction(self) -> None:
        self.reducer.finish()

    def clip_grad_norm(self, max_norm: float) -> float:
        return clip_grad_norm(list(self.model.parameters()), max_norm, self.pstate).item()

    def count_zero_grads(self) -> int:
        return count_zero_grads(list(self.model.parameters()), self.pstate, self.device)

    def params_norm(self, masters: dict | None = None) -> float:
        """Global parameter norm, each element counted on exactly one rank; of the fp32 masters where ZeRO-1
        keeps them (`OptimizerSet.owned_masters`: each on the rank of its gradient group that owns it), as
        Megatron-LM reports it, not of the bf16 rounding."""
        masters = masters or {}
        square = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in self.model.parameters():
            # ZeRO-1 shards a sequence-parallel replicated weight's masters over its gradient group, the whole
            # world: every TP rank owns pieces of it (data.py's norm counts their gradients so too)
            spread_over_tp = p in masters and reduction_kind(p) == "sequence_parallel"
            if not (getattr(p, "tensor_model_parallel", False) or self.pstate.tp_rank == 0 or spread_over_tp):
                continue        # a replica of tensor-parallel rank 0's
            replica = self.pstate.expert_dp_rank if is_expert(p) else self.pstate.dp_cp_rank
            pieces = masters.get(p, [(0, p.numel(), p.detach().reshape(-1))] if replica == 0 else [])
            rows = getattr(p, "tp_replicated_rows", None)   # KV heads shared by TP ranks (TP > HKV)
            shared = (rows[0] * p[0].numel(), rows[1] * p[0].numel()) if (
                rows is not None and not getattr(p, "tp_replica_primary", True)) else None
            for start, end, values in pieces:
                square += sum_of_squares(values).double()
                lo, hi = (max(start, shared[0]), min(end, shared[1])) if shared is not None else (0, 0)
                if lo < hi:         # rows the primary replica counts
                    square -= sum_of_squares(values[lo - start:hi - start]).double()
        dist.all_reduce(square)
        return math.sqrt(square.item())

    def check_replicas_equal(self) -> None:
        """--check-weight-hash-across-dp-replicas-interval: a SHA-256 of every weight, compared among the
        ranks that must hold the same copy (dense weights over DP x CP, expert weights over expert-DP).
        Every rank raises RuntimeError when any group differs, the ranks of that group naming the
        weights."""
        digests = {"dense": [], "expert": []}
        names = {"dense": [], "expert": []}
        for name, p in self.model.named_parameters():
            kind = "expert" if is_expert(p) else "dense"
            data = p.detach().reshape(-1).cpu().view(torch.uint8).numpy()     # (flat: a 0-dim tensor has no byte view)
            digests[kind].append(hashlib.sha256(data).hexdigest())
            names[kind].append(name)
        differing = []
        for kind, group in (("dense", self.pstate.dp_cp_group), ("expert", self.pstate.expert_dp_group)):
            size = dist.get_world_size(group)
            if size == 1:
                continue
            every = [None] * size
            dist.all_gather_object(every, digests[kind], group=group)
            differing += [name for i, name in enumerate(names[kind]) if len({d[i] for d in every}) > 1]
        found = torch.tensor([len(differing)], dtype=torch.int64, device=self.device)
        dist.all_reduce(found, op=dist.ReduceOp.MAX)      # every rank stops, not only the ones that saw it
        if found.item():
            where = (f"{len(differing)} weights differ among this rank's replicas, e.g. {', '.join(differing[:4])}"
                     if differing else "weights differ on another replica group (see its ranks' errors)")
            raise RuntimeError(f"--check-weight-hash-across-dp-replicas-interval: data-parallel replicas are out "
                               f"of sync on rank {self.rank}: {where}")

    def barrier(self) -> None:
        dist.barrier()

    def shutdown(self) -> None:
        destroy_distributed()
