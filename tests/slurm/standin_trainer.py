"""A stand-in for pretrain_zaya.py that exercises run_mi300x.sh without torch (launcher tests).

    TRAIN_SCRIPT=tests/slurm/standin_trainer.py TRAIN_ARGS="--train-iters 20" CKPT_DIR=/tmp/ckpt \
        sbatch --nodes=2 --ntasks-per-node=2 run_mi300x.sh

It behaves like the trainer where the launcher can see it: it reads the rank layout from the
environment the launcher sets, resumes from `--load`'s latest_checkpointed_iteration.txt, "trains"
one iteration per STANDIN_ITER_SECONDS (default 0.2; STANDIN_RESUME_ITER_SECONDS once resumed), and
rank 0 saves Megatron-style checkpoint folders (iter_0000010/ + latest_checkpointed_iteration.txt)
every --save-interval iterations and at the end. On SIGUSR1/SIGTERM it saves and exits 0, like the real trainer.
Fault injection: STANDIN_FAIL_NODE=lnode2 (or * for all) makes the ranks on that node exit 3 at iteration
STANDIN_FAIL_AT (default 3) while ZAYA_RESTART is 0 (the first submission; every submission with
STANDIN_FAIL_ALWAYS=1).
STANDIN_ABORT_AT_EXIT_NODE=lnode2: the ranks on that node abort after training has finished.
STANDIN_DEFAULT_SIGTERM=1: no SIGTERM handler (a trainer still starting up): srun's SIGTERM kills it (143).
Every rank prints one `standin:` line with its view of the job, which the tests parse.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time


def latest(ckpt: str | None) -> int:
    if not ckpt:
        return 0
    try:
        with open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 0


def save(ckpt: str, it: int, rank: int) -> None:
    if rank != 0 or not ckpt:
        return
    d = os.path.join(ckpt, f"iter_{it:07d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "state.json"), "w") as f:
        json.dump({"iteration": it}, f)
    tmp = os.path.join(ckpt, "latest_checkpointed_iteration.txt.tmp")
    with open(tmp, "w") as f:
        f.write(f"{it}\n")
    os.replace(tmp, os.path.join(ckpt, "latest_checkpointed_iteration.txt"))
    print(f"standin: saved checkpoint at iteration {it}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--train-iters", type=int, default=10)
    p.add_argument("--save")
    p.add_argument("--load")
    p.add_argument("--save-interval", type=int, default=5)
    a, unknown = p.parse_known_args()
    rank = int(os.environ["RANK"])
    stop = {"sig": None}

    def handler(signum, frame):
        stop["sig"] = signal.Signals(signum).name[3:]

    signal.signal(signal.SIGUSR1, handler)
    if os.environ.get("STANDIN_DEFAULT_SIGTERM") != "1":
        signal.signal(signal.SIGTERM, handler)

    start = latest(a.load)
    view = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
                                           "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURMD_NODENAME",
                                           "SLURM_RESTART_COUNT", "ZAYA_RESTART", "HSA_NO_SCRATCH_RECLAIM",
                                           "NCCL_IB_GID_INDEX", "OMP_NUM_THREADS", "TRITON_CACHE_DIR",
                                           "MIOPEN_USER_DB_PATH")}
    view.update(resumed_from=start, unknown_args=unknown, pid=os.getpid())
    print("standin: " + json.dumps(view, sort_keys=True), flush=True)
    # The launcher's MASTER_ADDR must resolve (the real trainer connects to it).
    socket.gethostbyname(os.environ["MASTER_ADDR"])

    fail_node = os.environ.get("STANDIN_FAIL_NODE")
    fail_at = int(os.environ.get("STANDIN_FAIL_AT", "3"))
    first_submission = os.environ.get("ZAYA_RESTART", "0") == "0" or os.environ.get("STANDIN_FAIL_ALWAYS") == "1"
    it = start
    step_seconds = float(os.environ.get("STANDIN_ITER_SECONDS", "0.2"))
    if start > 0 and os.environ.get("STANDIN_RESUME_ITER_SECONDS"):
        step_seconds = float(os.environ["STANDIN_RESUME_ITER_SECONDS"])
    while it < a.train_iters:
        time.sleep(step_seconds)
        if stop["sig"]:
            print(f"standin: rank {rank} got SIG{stop['sig']} at iteration {it}: saving and exiting", flush=True)
            if it > start:             # nothing new to save otherwise
                save(a.save, it, rank)
            return 0
        it += 1
        if fail_node in ("*", os.environ.get("SLURMD_NODENAME")) and first_submission and it == fail_at:
            print(f"standin: rank {rank} injected failure at iteration {it}", flush=True)
            return 3
        if rank == 0:
            print(f"standin: iteration {it}", flush=True)
        if a.save_interval and it % a.save_interval == 0:
            save(a.save, it, rank)
    save(a.save, it, rank)
    print(f"standin: rank {rank} finished at iteration {it}", flush=True)
    if os.environ.get("STANDIN_ABORT_AT_EXIT_NODE") == os.environ.get("SLURMD_NODENAME"):
        time.sleep(0.5)                # after rank 0's final save
        os.abort()                     # a crash while shutting down (exit code 134)
    return 0


if __name__ == "__main__":
    sys.exit(main())
