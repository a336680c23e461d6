"""Resharding proof (run under torchrun, or as one plain process): train a tiny model under one
parallel layout, save a checkpoint through TrainingCheckpointer, keep training; then, in the same
processes or another launch, build the model under OTHER layouts, load that checkpoint and train the
same steps: the losses must agree (fp32; 1e-5 relative across layouts, whose reductions differ).

    worker.py DIR save:tp2-ep2-zero load:cp2-ep2 load:dp     (torchrun, 4 processes)
    worker.py DIR load:single                                  (one process, no torch.distributed)
A third field names the checkpoint folder under DIR (default "ckpt"): save:cp2-ep2:b load:single:b.
Layout syntax as tests/parallel: tp2, cp2, ep2, dp, zero joined by '-'; "single" = no parallel
package at all. Every result is appended to DIR/losses.json (rank 0), with how many model elements,
rank JSONs and rank tensor files each rank read at a load, and the elements read from those files
(model and optimizer state), and each rank's next RNG draws when it saved (each rank seeded on its own) or
after it loaded. CKPT_TEST_MIN_SHARE_BYTES sets replica_owners.MIN_SHARE_BYTES (0: every
tensor over its group's even share is saved in row shares); a task with a fourth field `whole`
(save:dp-zero:w:whole) keeps the library's. Under torchrun, `loadfail:LAYOUT` loads while rank 1's model
reads fail (`loadfailstep`: its reads of optimizer step counts) and `loadbadjson:LAYOUT:X` loads X after
damaging rank_00002.json: each rank writes the error it raised to DIR/<task kind>_<rank>.txt.
"""
from __future__ import annotations

import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from megatron_zaya.arguments import ParallelSizes, RunConfig  # noqa: E402
from megatron_zaya.checkpoint.format import CheckpointError, CheckpointFolder, RankFile  # noqa: E402
import megatron_zaya.checkpoint.replica_owners as replica_owners  # noqa: E402
import megatron_zaya.checkpoint.training as checkpoint_training  # noqa: E402
from megatron_zaya.checkpoint.training import TrainingCheckpointer  # noqa: E402
from megatron_zaya.config import model_config_from_preset  # noqa: E402
from megatron_zaya.model import ZayaModel  # noqa: E402
from megatron_zaya.optim.balancing import BalancingBiasUpdater  # noqa: E402
from megatron_zaya.optim.builder import OptimizerConfig, OptimizerSet  # noqa: E402
from megatron_zaya.training.config import TrainConfig  # noqa: E402
from megatron_zaya.training.loop import TrainState  # noqa: E402
from megatron_zaya.parallel.launch import exit_process  # noqa: E402

GLOBAL_BATCH, SEQ, LR, CLIP = 4, 32, 1e-3, 1.0
SAVE_AT, TOTAL = 2, 4


MODEL_READS: list[int] = []      # the elements of each model block this rank read from the checkpoint in the last load
FAILING_READS = {"rank": None, "prefix": "model/"}   # tasks loadfail, loadfailstep: this rank's reads raise
_piece = CheckpointFolder.piece


OPTIM_READS: list[str] = []      # the optimizer-state tensors (not scalars) this rank read in the last load


def _failing(key: str) -> bool:
    return key.startswith(FAILING_READS["prefix"]) and FAILING_READS["rank"] == (
        dist.get_rank() if dist.is_initialized() else 0)


def _counted_piece(self, key, *args, **kwargs):
    if key.startswith("optim/") and self.global_shape(key) != []:       # (step counts: SharedReads.whole_tensors)
        OPTIM_READS.append(key)
    if key.startswith("model/") and _failing(key):
        raise CheckpointError(f"injected failure reading {key}")
    block = _piece(self, key, *args, **kwargs)
    if key.startswith("model/"):
        MODEL_READS.append(block.numel())
    return block


CheckpointFolder.piece = _counted_piece
FILE_READS: set[int] = set()     # the rank files this rank read tensors from in the last load


OPTIM_ELEMENTS = [0]             # the optimizer-state elements this rank read from rank files in the last load
MODEL_ELEMENTS = [0]             # the model elements this rank read from rank files in the last load


def _counted(read):
    """RankFile.get / get_box, counting the file and the elements read (and failing on loadfailstep)."""
    def counted(self, key, *args, **kwargs):
        if key.endswith("/step") and _failing(key):
            raise CheckpointError(f"injected failure reading {key}")
        FILE_READS.add(self.rank)
        tensor = read(self, key, *args, **kwargs)
        for prefix, count in (("optim/", OPTIM_ELEMENTS), ("model/", MODEL_ELEMENTS)):
            if key.startswith(prefix):
                count[0] += tensor.numel()
        return tensor
    return counted


RankFile.get, RankFile.get_box = _counted(RankFile.get), _counted(RankFile.get_box)
LIBRARY_MIN_SHARE_BYTES = replica_owners.MIN_SHARE_BYTES
MIN_SHARE_BYTES = int(os.environ.get("CKPT_TEST_MIN_SHARE_BYTES", LIBRARY_MIN_SHARE_BYTES))
JSON_READS: list[int] = []       # the rank JSONs this rank read in the last load
_read_rank_meta = checkpoint_training.read_rank_meta


def _counted_read_rank_meta(folder, rank, manifest):
    JSON_READS.append(rank)
    return _read_rank_meta(folder, rank, manifest)


checkpoint_training.read_rank_meta = _counted_read_rank_meta


def per_rank(world: int, count: int) -> list[int]:
    counts = torch.zeros(world)
    counts[dist.get_rank() if world > 1 else 0] = count
    if world > 1:
        dist.all_reduce(counts)
    return [int(c) for c in counts.tolist()]


def next_draws() -> list[int]:
    """The next number torch, numpy and Python's random would each draw, leaving their states as they were."""
    torch_state, np_state, py_state = torch.get_rng_state(), np.random.get_state(), random.getstate()
    draws = [int(torch.randint(0, 10**6, ())), int(np.random.randint(0, 10**6)), random.randrange(10**6)]
    torch.set_rng_state(torch_state)
    np.random.set_state(np_state)
    random.setstate(py_state)
    return draws


def rng_per_rank(world: int) -> list[list[int]]:
    """Each rank's next_draws (below 2**24: exact in the float32 all-reduce of per_rank)."""
    return [per_rank(world, draw) for draw in next_draws()]


def config():
    return model_config_from_preset("zaya1-tiny", num_layers=2, vocab_size=256, seq_length=SEQ)


def build_model():
    torch.manual_seed(1234)
    model = ZayaModel(config())
    g = torch.Generator().manual_seed(7)
    for block in model.layers:
        block.moe.router.balancing_bias.copy_(torch.randn(5, generator=g) * 0.05)
    return model


def global_batch(step):
    g = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, 256, (GLOBAL_BATCH, SEQ + 1), generator=g)
    mask = (torch.rand(GLOBAL_BATCH, SEQ, generator=g) > 0.1).float()
    pos = torch.arange(SEQ).unsqueeze(0).expand(GLOBAL_BATCH, SEQ)
    return {"tokens": tokens[:, :-1], "labels": tokens[:, 1:], "loss_mask": mask, "position_ids": pos}


class Runtime:
    def __init__(self, world):
        self.world_size = world
        self.rank = dist.get_rank() if world > 1 else 0
        self.is_main = self.rank == 0
        self.device = torch.device("cpu")

    def max_over_all_ranks(self, t):
        if self.world_size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t

    def barrier(self):
        if self.world_size > 1:
            dist.barrier()


class Setup:
    """Model, optimizer (AdamW: element-wise, so its result does not depend on the layout), balancer,
    and one training step, under a layout."""

    def __init__(self, spec: str, world: int):
        self.spec, self.world = spec, world
        self.model = build_model()
        self.ps = None
        adam = lambda groups: torch.optim.AdamW(groups, lr=LR, weight_decay=0.1)   # noqa: E731
        if spec == "single":
            self.optimizer = OptimizerSet({"adamw": adam([{"params": list(self.model.parameters())}])})
        else:
            from megatron_zaya.optim.distributed import DistributedOptimizer
            from megatron_zaya.parallel.apply import parallelize_model
            from megatron_zaya.parallel.data import GradientReducer
            from megatron_zaya.parallel.state import ParallelState
            sizes = {k: int(v) for k, v in re.findall(r"(tp|cp|ep)(\d+)", spec)}
            self.zero = "zero" in spec
            self.ps = ParallelState(sizes.get("tp", 1), sizes.get("cp", 1), sizes.get("ep", 1), world,
                                    model_config=config())
            self.model = parallelize_model(self.model, self.ps)
            self.reducer = GradientReducer(self.model, self.ps, bucket_size=30_000, shard=self.zero)
            if self.zero:
                self.optimizer = OptimizerSet({"adamw": DistributedOptimizer(
                    list(self.model.parameters()), adam, self.ps, reducer=self.reducer)})
            else:
                self.optimizer = OptimizerSet({"adamw": adam([{"params": list(self.model.parameters())}])})
        self.balancer = BalancingBiasUpdater([b.moe.router.balancing_bias for b in self.model.layers])
        self.state = TrainState()

    def step(self, step: int) -> float:
        batch = global_batch(step)
        count = batch["loss_mask"].sum()
        if self.ps is None:
            out = self.model(batch["tokens"], labels=batch["labels"], position_ids=batch["position_ids"])
            loss = (out.token_losses * batch["loss_mask"]).sum() / count
            loss.backward()
            counts = torch.stack([r.counts for r in out.routing])
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)
            total = loss.detach()
        else:
            from megatron_zaya.parallel.context import slice_batch_for_cp
            from megatron_zaya.parallel.data import clip_grad_norm
            ps = self.ps
            per = GLOBAL_BATCH // ps.dp_size
            mine = {k: v[ps.dp_rank * per:(ps.dp_rank + 1) * per] for k, v in batch.items()}
            mb = slice_batch_for_cp(mine, ps)
            out = self.model(mb["tokens"], labels=mb["labels"], position_ids=mb["position_ids"])
            loss = (out.token_losses * mb["loss_mask"]).sum() / count
            loss.backward()
            self.reducer.finish()
            total = loss.detach().clone()
            dist.all_reduce(total, group=ps.dp_cp_group)
            counts = torch.stack([r.counts for r in out.routing])
            clip_grad_norm(self.model.parameters(), CLIP, ps)
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.ps is not None:
            self.reducer.zero_grad()
        self.balancer.update(counts)
        self.state.iteration += 1
        self.state.consumed_samples += GLOBAL_BATCH
        return float(total)


def checkpointer(directory: str, runtime: Runtime, spec: str, load: bool) -> TrainingCheckpointer:
    sizes = {k: int(v) for k, v in re.findall(r"(tp|cp|ep)(\d+)", spec)}
    parallel = ParallelSizes(runtime.world_size, sizes.get("tp", 1), sizes.get("cp", 1), sizes.get("ep", 1),
                             False, "zero" in spec)
    train = TrainConfig(save=None if load else directory, load=directory if load else None,
                        watchdog_min_seconds=0)
    return TrainingCheckpointer(RunConfig(config(), train, OptimizerConfig(optimizer="adamw", lr=LR), parallel,
                                          None, None), runtime)


def main() -> int:
    directory, tasks = sys.argv[1], sys.argv[2:]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        from megatron_zaya.parallel.launch import init_distributed
        init_distributed()
    torch.set_num_threads(1)
    runtime = Runtime(world)
    results = []
    for task in tasks:
        mode, spec, *sub = task.split(":")
        # a fourth field "whole": this task keeps the library's 16 MiB floor (tiny tensors whole)
        replica_owners.MIN_SHARE_BYTES = LIBRARY_MIN_SHARE_BYTES if sub[1:] == ["whole"] else MIN_SHARE_BYTES
        s = Setup(spec, world)
        ck = checkpointer(os.path.join(directory, sub[0] if sub else "ckpt"), runtime, spec, load=mode != "save")
        losses = {}
        if mode in ("loadfail", "loadfailstep", "loadbadjson"):     # every rank raises, none hangs
            if mode.startswith("loadfail"):           # rank 1 cannot read its share of the model / step counts
                FAILING_READS.update(rank=1, prefix="model/" if mode == "loadfail" else "optim/")
            else:                                     # rank 2's JSON (which rank 2 reads) is damaged
                dist.barrier()
                if dist.get_rank() == 0:
                    with open(os.path.join(directory, sub[0], "iter_0000002", "rank_00002.json"), "a") as f:
                        f.write(" ")
                dist.barrier()
            try:
                ck.load(s)
                message = "loaded"
            except CheckpointError as err:
                message = str(err)
            FAILING_READS["rank"] = None
            ck.close()
            with open(os.path.join(directory, f"{mode}_{dist.get_rank()}.txt"), "w") as f:
                f.write(message)
            continue
        if mode == "save":
            for step in range(SAVE_AT):
                losses[step + 1] = s.step(step)
            seed = 50 + runtime.rank                  # each rank's own RNG state, which its load must restore
            torch.manual_seed(seed)
            np.random.seed(seed)
            random.seed(seed)
            rng = rng_per_rank(world)
            ck.save(s)
        else:
            MODEL_READS.clear()
            OPTIM_READS.clear()
            JSON_READS.clear()
            FILE_READS.clear()
            OPTIM_ELEMENTS[0] = MODEL_ELEMENTS[0] = 0
            torch.manual_seed(0)                      # not what any rank saved
            ck.load(s)
            assert s.state.iteration == SAVE_AT, s.state
            rng = rng_per_rank(world)
        for step in range(s.state.iteration, TOTAL):
            losses[step + 1] = s.step(step)
        ck.close()
        results.append({"task": task, "world": world, "losses": losses, "rng": rng,
                        "loaded_from": (ck.loaded or {}).get("layout"),
                        "model_reads": per_rank(world, sum(MODEL_READS)) if mode == "load" else None,
                        "json_reads": per_rank(world, len(JSON_READS)) if mode == "load" else None,
                        "optim_reads": per_rank(world, len(OPTIM_READS)) if mode == "load" else None,
                        "files_read": per_rank(world, len(FILE_READS)) if mode == "load" else None,
                        "optim_elements": per_rank(world, OPTIM_ELEMENTS[0]) if mode == "load" else None,
                        "model_file_elements": per_rank(world, MODEL_ELEMENTS[0]) if mode == "load" else None,
                        "model_tensors": len(s.model.state_dict()),
                        "model_elements": sum(t.numel() for t in s.model.state_dict().values())})
    if runtime.is_main:
        path = os.path.join(directory, "losses.json")
        old = json.load(open(path)) if os.path.exists(path) else []
        with open(path, "w") as f:
            json.dump(old + results, f)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_process(main())
