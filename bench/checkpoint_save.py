"""How long a checkpoint save blocks the training loop: --async-save (copy to host, write in the
background) and our synchronous sharded save, against a synchronous torch.save of the same full state
(model + optimizer + balancer + RNG) of the same model.

    python bench/checkpoint_save.py                      # zaya1-100m: ~1 GB of state, one process
    python bench/checkpoint_save.py --preset zaya1-tiny --repeats 2 --json save.json

The optimizer (Muon + AdamW) takes one step on random gradients first so that its state exists.
Between timed saves, the state is changed in place (like a training step). Async: the blocking time
of every save after the first (buffers reused; the first one allocates them) and the background
write time. Each checkpoint written is loaded back and compared with the live state.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from megatron_zaya.arguments import ParallelSizes, RunConfig  # noqa: E402
from megatron_zaya.checkpoint.format import CheckpointFolder  # noqa: E402
from megatron_zaya.checkpoint.training import TrainingCheckpointer  # noqa: E402
from megatron_zaya.config import model_config_from_preset  # noqa: E402
from megatron_zaya.model import ZayaModel  # noqa: E402
from megatron_zaya.optim.balancing import BalancingBiasUpdater  # noqa: E402
from megatron_zaya.optim.builder import OptimizerConfig, build_optimizer  # noqa: E402
from megatron_zaya.training.config import TrainConfig  # noqa: E402
from megatron_zaya.training.loop import TrainState  # noqa: E402
from megatron_zaya.training.runtime import SingleProcess  # noqa: E402


class Bench:
    def __init__(self, preset: str):
        torch.manual_seed(0)
        self.config = model_config_from_preset(preset)
        self.model = ZayaModel(self.config)
        self.optimizer = build_optimizer(self.model, OptimizerConfig())
        self.balancer = BalancingBiasUpdater([b.moe.router.balancing_bias for b in self.model.layers])
        self.state = TrainState()
        self.step()

    @torch.no_grad()
    def step(self):
        """A stand-in training step: random gradients, a real optimizer step."""
        for p in self.model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        self.optimizer.step()
        self.optimizer.zero_grad()
        counts = torch.randint(1, 100, (self.config.num_layers, self.config.num_experts + 1))
        self.balancer.update(counts)
        self.state.iteration += 1
        self.state.consumed_samples += 16

    def state_bytes(self) -> int:
        total = sum(t.numel() * t.element_size() for t in self.model.state_dict().values())
        for opt in self.optimizer.optimizers.values():
            for s in opt.state.values():
                total += sum(v.numel() * v.element_size() for v in s.values() if torch.is_tensor(v))
        return total

    def torch_save(self, path: str, fsync: bool) -> float:
        start = time.perf_counter()
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "balancer": self.balancer.state_dict(), "rng": torch.get_rng_state(),
                    "iteration": self.state.iteration}, path)
        if fsync:
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
        return time.perf_counter() - start

    def checkpointer(self, directory: str, async_save: bool) -> TrainingCheckpointer:
        train = TrainConfig(save=directory, async_save=async_save, watchdog_min_seconds=0)
        run = RunConfig(self.config, train, OptimizerConfig(), ParallelSizes(1), None, None)
        return TrainingCheckpointer(run, SingleProcess(torch.device("cpu")))

    def check(self, folder: str) -> None:
        saved = CheckpointFolder(folder)
        for name, t in self.model.state_dict().items():
            if not torch.equal(saved.full("model/" + name), t):
                raise SystemExit(f"{folder}: {name} differs from the live model")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="zaya1-100m")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir)
    try:
        b = Bench(args.preset)
        size = b.state_bytes()
        results = {"preset": args.preset, "state_bytes": size, "threads": torch.get_num_threads(),
                   "torch": torch.__version__, "device": "cpu"}
        print(f"{args.preset}: {size / 2**20:.0f} MiB of model + optimizer state; torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads, writing to {root}")
        results["torch_save_s"] = statistics.median(b.torch_save(os.path.join(root, f"full{i}.pt"), False)
                                                    for i in range(args.repeats))
        results["torch_save_fsync_s"] = statistics.median(b.torch_save(os.path.join(root, f"fullsync{i}.pt"), True)
                                                          for i in range(args.repeats))
        for i in range(args.repeats):
            os.unlink(os.path.join(root, f"full{i}.pt"))
            os.unlink(os.path.join(root, f"fullsync{i}.pt"))

        sync = b.checkpointer(os.path.join(root, "sync"), async_save=False)
        times = []
        for _ in range(args.repeats):
            b.step()
            start = time.perf_counter()
            sync.save(b)
            times.append(time.perf_counter() - start)
        sync.close()
        b.check(os.path.join(root, "sync", f"iter_{b.state.iteration:07d}"))
        results["sharded_sync_s"] = statistics.median(times)

        asyn = b.checkpointer(os.path.join(root, "async"), async_save=True)
        blocking, background = [], []
        for i in range(args.repeats + 1):
            b.step()
            start = time.perf_counter()
            asyn.save(b)
            blocking.append(time.perf_counter() - start)
            asyn.writer.wait()
            background.append(time.perf_counter() - start)
            b.check(os.path.join(root, "async", f"iter_{b.state.iteration:07d}"))
        asyn.close()
        results["async_first_blocking_s"] = blocking[0]
        results["async_blocking_s"] = statistics.median(blocking[1:])
        results["async_total_write_s"] = statistics.median(background[1:])
        results["speedup_vs_torch_save"] = results["torch_save_s"] / results["async_blocking_s"]
        results["speedup_vs_torch_save_fsync"] = results["torch_save_fsync_s"] / results["async_blocking_s"]
        print(f"  torch.save (full state, one file)          {results['torch_save_s']:8.3f} s")
        print(f"  torch.save + fsync                         {results['torch_save_fsync_s']:8.3f} s")
        print(f"  sharded save, synchronous (fsync, crc32)   {results['sharded_sync_s']:8.3f} s")
        print(f"  --async-save: loop blocked, first save     {results['async_first_blocking_s']:8.3f} s (allocates host buffers)")
        print(f"  --async-save: loop blocked, later saves    {results['async_blocking_s']:8.3f} s "
              f"({results['speedup_vs_torch_save']:.1f}x less than torch.save, "
              f"{results['speedup_vs_torch_save_fsync']:.1f}x less than torch.save + fsync)")
        print(f"  --async-save: background write to complete {results['async_total_write_s']:8.3f} s")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
