"""pretrain_zaya.py with fault injection for the checkpoint tests (run as a script; single process
or under torchrun). Environment:
  CKPT_TEST_SLOW_SAVE=S      sleep S seconds inside every save, between a rank's tensor file and its JSON
  CKPT_TEST_HANG_SAVE_AT=N   hang (sleep for an hour) there in the save of iteration N, on rank
                             CKPT_TEST_HANG_SAVE_RANK (every rank if unset): a kill lands inside that save
  CKPT_TEST_SLOW_STEP=S      sleep S seconds in every iteration (time for a signal to arrive mid-run)
  CKPT_TEST_SLOW_EVAL=S      sleep S seconds in every evaluation
  CKPT_TEST_HANG_AT=N        hang (sleep for an hour) in iteration N on rank CKPT_TEST_HANG_RANK (0)
  CKPT_TEST_WATCHDOG=MIN,F[,FIRST]  watchdog_min_seconds=MIN, watchdog_timeout_factor=F
                             (, watchdog_first_iteration_seconds=FIRST); with several ranks the hung
                             rank gets 3 x MIN, so the healthy ranks (stuck in a collective) fire first
  CKPT_TEST_NAN_FORWARD=R:L  from the first iteration on, rank R's block layers[L] outputs NaN
  CKPT_TEST_LOSSES=PATH      write {iteration: exact loss} as JSON (rank 0) at the end / after each step
  CKPT_TEST_PIDDIR=DIR       write this process's pid to DIR/<rank>.pid (to signal training processes only)
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from megatron_zaya.arguments import parse_args  # noqa: E402
from megatron_zaya.checkpoint import saver  # noqa: E402
from megatron_zaya.training import loop  # noqa: E402
from megatron_zaya.training.setup import build_and_train  # noqa: E402
from megatron_zaya.parallel.launch import exit_process  # noqa: E402


def main() -> int:
    env = os.environ
    if env.get("CKPT_TEST_PIDDIR"):
        with open(os.path.join(env["CKPT_TEST_PIDDIR"], f"{env.get('RANK', '0')}.pid"), "w") as f:
            f.write(str(os.getpid()))
    hang_save = int(env.get("CKPT_TEST_HANG_SAVE_AT", "0"))
    if env.get("CKPT_TEST_SLOW_SAVE") or hang_save:
        delay = float(env.get("CKPT_TEST_SLOW_SAVE", "0"))
        hang_ranks = env.get("CKPT_TEST_HANG_SAVE_RANK")
        original_init = saver.CheckpointWriter.__init__

        def after_tensors(rank, stage, path):
            if stage != "after_tensors":
                return
            if hang_save and f"iter_{hang_save:07d}." in path and hang_ranks in (None, str(rank)):
                time.sleep(3600)
            time.sleep(delay)

        def init(self, *a, **k):
            original_init(self, *a, **k)
            self.fault_hook = lambda stage, path, rank=self.rank: after_tensors(rank, stage, path)
        saver.CheckpointWriter.__init__ = init

    losses = {}
    step = loop.Trainer.train_step
    hang_at = int(env.get("CKPT_TEST_HANG_AT", "0"))
    hang_rank = int(env.get("CKPT_TEST_HANG_RANK", "0"))
    slow_step = float(env.get("CKPT_TEST_SLOW_STEP", "0"))

    nan_forward = [int(v) for v in env["CKPT_TEST_NAN_FORWARD"].split(":")] if env.get("CKPT_TEST_NAN_FORWARD") else None

    def train_step(trainer, micro_batches):
        if nan_forward and trainer.parallel.rank == nan_forward[0] and not hasattr(trainer, "_nan_hook"):
            trainer._nan_hook = trainer.model.layers[nan_forward[1]].register_forward_hook(
                lambda module, inputs, out: (out[0] * float("nan"), *out[1:]))
        if hang_at and trainer.state.iteration + 1 == hang_at and trainer.parallel.rank == hang_rank:
            print(f"rank {hang_rank}: hanging in iteration {hang_at}", flush=True)
            time.sleep(3600)
        if slow_step:
            time.sleep(slow_step)
        result = step(trainer, micro_batches)
        losses[trainer.state.iteration + 1] = result.loss
        if env.get("CKPT_TEST_LOSSES") and trainer.parallel.rank == 0:
            with open(env["CKPT_TEST_LOSSES"] + ".tmp", "w") as f:
                json.dump(losses, f)
            os.replace(env["CKPT_TEST_LOSSES"] + ".tmp", env["CKPT_TEST_LOSSES"])
        return result
    loop.Trainer.train_step = train_step
    if env.get("CKPT_TEST_SLOW_EVAL"):
        evaluate = loop.Trainer.evaluate

        def slow_evaluate(trainer, *args, **kwargs):
            time.sleep(float(env["CKPT_TEST_SLOW_EVAL"]))
            return evaluate(trainer, *args, **kwargs)
        loop.Trainer.evaluate = slow_evaluate

    run = parse_args(sys.argv[1:])
    if env.get("CKPT_TEST_WATCHDOG"):
        minimum, factor, *first = map(float, env["CKPT_TEST_WATCHDOG"].split(","))
        if hang_at and int(env.get("WORLD_SIZE", "1")) > 1 and int(env.get("RANK", "0")) == hang_rank:
            minimum *= 3
        run.train.watchdog_min_seconds, run.train.watchdog_timeout_factor = minimum, factor
        if first:
            run.train.watchdog_first_iteration_seconds = first[0]
    torch.manual_seed(run.train.seed)
    return build_and_train(run)


if __name__ == "__main__":
    exit_process(main())
