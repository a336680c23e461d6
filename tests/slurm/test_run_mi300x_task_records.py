"""run_mi300x.sh's per-task wrapper (`--task`): the exit record each rank leaves for the launcher.

    python -m pytest -q tests/slurm/test_run_mi300x_task_records.py

The launcher blames the nodes whose ranks left no record (lost nodes). Two ways a healthy rank left none:
- Slurm stops a step with SIGTERM and, KillWait seconds later, SIGKILLs every process still there; a trainer
  stuck in a collective is still there, and its wrapper dies with it before writing the record;
- a TRAIN_ENV_SETUP file that turns on `set -e` made the wrapper's `wait` end it at a failed trainer.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from fake_slurm import write_latest
from slurm_jobs import LAUNCHER


def start_task(attempt, trainer: str, **env) -> subprocess.Popen:
    os.makedirs(attempt / "exit", exist_ok=True)
    env = dict(os.environ, SLURM_PROCID="1", SLURM_LOCALID="1", SLURM_NTASKS="2", SLURMD_NODENAME="node7", **env)
    return subprocess.Popen(["bash", LAUNCHER, "--task", str(attempt), "--", "bash", "-c", trainer], env=env,
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def record(attempt) -> list[str]:
    with open(attempt / "exit" / "rank-1") as f:
        return f.read().split()


def wait_for_record(attempt, timeout: float = 10) -> list[str]:
    deadline = time.monotonic() + timeout
    while not os.path.exists(attempt / "exit" / "rank-1") and time.monotonic() < deadline:
        time.sleep(0.05)
    return record(attempt)


def test_a_task_killed_after_ignoring_sigterm_has_a_record_naming_the_signal(tmp_path):
    ready = tmp_path / "ready"
    task = start_task(tmp_path, f"trap '' TERM; touch {ready}; sleep 30")     # stuck: TERM does nothing
    try:
        while not ready.exists():
            time.sleep(0.05)
        os.kill(task.pid, signal.SIGTERM)                 # srun stopping the step
        got = wait_for_record(tmp_path)
        assert got[:4] == ["node7", "1", "137", "TERM"] and got[5:] == ["pending"], got
    finally:
        os.killpg(task.pid, signal.SIGKILL)              # Slurm after KillWait: the wrapper too
        task.wait(timeout=10)
    assert record(tmp_path)[:4] == ["node7", "1", "137", "TERM"]


def test_the_final_record_replaces_the_first_when_the_trainer_exits(tmp_path):
    ready = tmp_path / "ready"
    task = start_task(tmp_path, f"trap 'sleep 0.5; exit 3' TERM; touch {ready}; sleep 30 & wait")
    while not ready.exists():
        time.sleep(0.05)
    os.kill(task.pid, signal.SIGTERM)
    assert task.wait(timeout=20) == 3, task.stdout.read()
    assert record(tmp_path)[:4] == ["node7", "1", "3", "TERM"] and len(record(tmp_path)) == 5


def test_the_time_limit_warning_leaves_no_early_record(tmp_path):
    """SIGUSR1 never leads to Slurm's SIGKILL: a node lost while its trainer saves has no record and is blamed."""
    ready = tmp_path / "ready"
    task = start_task(tmp_path, f"touch {ready}; sleep 30")      # (started with SIGUSR1 ignored, as every trainer)
    try:
        while not ready.exists():
            time.sleep(0.05)
        os.kill(task.pid, signal.SIGUSR1)
        time.sleep(0.6)       # three of wait_for's polls
        assert not os.path.exists(tmp_path / "exit" / "rank-1")
    finally:
        os.killpg(task.pid, signal.SIGKILL)
        task.wait(timeout=10)


def test_set_e_in_train_env_setup_still_leaves_the_record(tmp_path):
    setup = tmp_path / "setup.sh"
    setup.write_text("set -euo pipefail\nexport FROM_SETUP=1\n")
    task = start_task(tmp_path, 'echo "setup: $FROM_SETUP"; exit 1', TRAIN_ENV_SETUP=str(setup))
    out = task.communicate(timeout=30)[0]
    assert task.returncode == 1, out
    assert "setup: 1" in (tmp_path / "rank-1.log").read_text()
    assert record(tmp_path)[:4] == ["node7", "1", "1", "none"], out


# srun with --kill-on-bad-exit and a KillWait of 1.5 s: once a task has exited non-zero, every task's process
# group gets SIGTERM, and SIGKILL 1.5 s later (the task wrappers too).
KILLWAIT_SRUN = r"""#!/usr/bin/env bash
[[ " $* " == *" --task "* ]] || exec "$SRUN_REAL" "$@"
while [[ $1 == -* ]]; do shift; done
NODES=(n1 n1 n2 n2); pids=()
for r in 0 1 2 3; do
    setsid env SLURM_PROCID=$r SLURM_LOCALID=$(( r % 2 )) SLURM_NODEID=$(( r / 2 )) SLURM_NTASKS=4 \
        SLURMD_NODENAME=${NODES[r]} "$@" & pids+=($!)
done
wait -n; rc=$?
sleep 0.3
for p in "${pids[@]}"; do kill -TERM -- -$p 2>/dev/null; done
sleep 1.5
for p in "${pids[@]}"; do kill -KILL -- -$p 2>/dev/null; done
wait
exit $rc
"""

STUCK = "trap '' TERM; sleep 30"       # a trainer in a hung collective, or a bad GPU's driver: deaf to SIGTERM


@pytest.mark.parametrize("trainer, expected", [
    # rank 1 aborts; the others hang in a collective until they are killed: the node of none is lost
    (f"(( RANK == 1 )) && {{ sleep 0.5; exit 134; }}; {STUCK}",
     ["3 killed while stopping, on 2 of 2 nodes: counted as stopped", "failed nodes: none identified"]),
    # n1's ranks fire the hang watchdog and exit; n2's never stop: n2 is the node to leave out
    (f"(( RANK < 2 )) && {{ sleep 0.5; exit 124; }}; {STUCK}",
     ["2 killed while stopping, on 1 of 2 nodes: counted as missing", "failed nodes: n2"]),
    # n2 is lost (its task wrappers die with their trainers, no record); n1's ranks hang waiting for it
    (f"(( RANK >= 2 )) && {{ sleep 0.5; kill -KILL $PPID $$; }}; {STUCK}",
     ["2 killed while stopping, on 1 of 2 nodes: counted as stopped", "failed nodes: n2"]),
    # n2 is lost; n1's ranks find their peers gone (gloo's "Connection closed by peer") and exit 123 before
    # srun's SIGTERM: not their node's fault
    ("(( RANK >= 2 )) && { sleep 0.5; kill -KILL $PPID $$; }; sleep 0.6; exit 123",
     ["0 rank(s) failed by themselves, 0 stopped by a signal, 0 stopped by the hang watchdog (124), 2 stopped by "
      "a lost peer (123), 2 missing", "failed nodes: n2"]),
], ids=["every-node-stuck", "one-node-deaf", "one-node-lost", "one-node-lost-peers-raise"])
def test_ranks_killed_after_killwait_blame_a_node_only_when_it_alone_did_not_stop(fake, tmp_path, trainer, expected):
    real = fake.move_aside("srun")
    fake.install("srun", KILLWAIT_SRUN)
    trainer_path = fake.install("trainer.sh", f"#!/usr/bin/env bash\n{trainer}\n")
    write_latest(str(tmp_path / "ckpt"), 5)
    fake.run_launcher(TRAIN_ITERS="10", SRUN_REAL=real, TRAIN_SCRIPT=trainer_path)
    log = fake.launcher_log()
    assert all(e in log for e in expected), log
    assert len(fake.calls("sbatch")) == 1 and "giving up" not in log, log
