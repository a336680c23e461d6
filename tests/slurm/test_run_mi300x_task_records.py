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
        assert got[:4] == ["node7", "1", "137", "TERM"], got
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
    assert record(tmp_path)[:4] == ["node7", "1", "3", "TERM"]


def test_set_e_in_train_env_setup_still_leaves_the_record(tmp_path):
    setup = tmp_path / "setup.sh"
    setup.write_text("set -euo pipefail\nexport FROM_SETUP=1\n")
    task = start_task(tmp_path, 'echo "setup: $FROM_SETUP"; exit 1', TRAIN_ENV_SETUP=str(setup))
    out = task.communicate(timeout=30)[0]
    assert task.returncode == 1, out
    assert "setup: 1" in (tmp_path / "rank-1.log").read_text()
    assert record(tmp_path)[:4] == ["node7", "1", "1", "none"], out
