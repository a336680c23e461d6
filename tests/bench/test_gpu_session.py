"""bench/gpu_session.sh keeps to its BUDGET: one device command may run 600 s, so a step that would pass the
budget is cut to what is left, later steps are skipped and said to be, and a step's processes that outlive
their SIGTERM (a trainer finishing its iteration) are killed before the next step. Run here with a stand-in
for python whose every step hangs."""
import os
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FAKE_PYTHON = """#!/usr/bin/env bash
[[ $1 == -c ]] && { echo "torch fake | triton fake"; exit 0; }   # the GPU check and the device line
# A step: a child that ignores SIGTERM (as a trainer finishing its iteration would) and keeps the step's output
# open, its pid noted.
bash -c 'trap "" TERM; echo $$ >> "$PIDS"; exec sleep 60' < /dev/null &
wait
"""


def alive(pid: int) -> bool:
    """Running or sleeping; a zombie (killed, not yet reaped by an init that may never reap it) is not."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def test_steps_are_cut_to_the_budget_skipped_after_it_and_leave_no_process(tmp_path):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    out, pids = tmp_path / "out", tmp_path / "pids"
    env = dict(os.environ, PYTHON=str(fake), OUT=str(out), BUDGET="3", MIN_STEP="2", PIDS=str(pids))
    start = time.monotonic()
    result = subprocess.run(["bash", str(REPO / "bench" / "gpu_session.sh")], env=env, capture_output=True,
                            text=True, timeout=120)
    took = time.monotonic() - start
    summary = (out / "summary.txt").read_text().splitlines()
    assert result.returncode == 1, result.stdout + result.stderr
    assert summary[0].startswith("sdpa_backends: rc=124"), summary        # cut from 30 s to the 3 s left
    assert len(summary) == 7 and all(" skipped (" in line for line in summary[1:]), summary
    assert took < 15, took                   # 3 s, not the steps' own 30-130 s limits
    noted = [int(p) for p in pids.read_text().split()]
    assert len(noted) == 1
    deadline = time.monotonic() + 5
    while alive(noted[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(noted[0]), "a step's child that ignored SIGTERM outlived the step"
