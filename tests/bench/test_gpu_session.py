"""bench/gpu_session.sh keeps to its BUDGET: one device command may run 600 s, so a step that would pass the
budget is cut to what is left, later steps are skipped and said to be, and a step's processes that outlive
their SIGTERM (a trainer finishing its iteration) are killed before the next step, and a step's last lines are
in the session's log before its summary line. Run here with stand-ins for python."""
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


# A step whose last line comes late: written by a child outside the step's process group (not killed with
# it), after the step itself has ended (once the child is in its own session: it removes the file `ready`).
LATE_PYTHON = """#!/usr/bin/env bash
[[ $1 == -c ]] && { echo "torch fake | triton fake"; exit 0; }
echo "first line of $1"
ready=$(mktemp)
setsid bash -c 'rm "$1"; sleep 0.4; echo "last line of $0"' "$1" "$ready" &
while [[ -e $ready ]]; do sleep 0.01; done
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


def test_a_steps_last_lines_come_before_its_summary_line(tmp_path):
    """The log's tee is waited for (at most 5 s) before the step's "NAME: rc=" line, so a step's output is not
    interleaved with the next step's header (it came after it)."""
    fake = tmp_path / "python"
    fake.write_text(LATE_PYTHON)
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=str(fake), OUT=str(out), BUDGET="2", MIN_STEP="1")
    result = subprocess.run(["bash", str(REPO / "bench" / "gpu_session.sh")], env=env, capture_output=True,
                            text=True, timeout=120)
    lines = result.stdout.splitlines()
    ran = [line.split(":")[0] for line in (out / "summary.txt").read_text().splitlines() if ": rc=" in line]
    assert len(ran) >= 2, result.stdout + result.stderr
    for name in ran:
        section = lines[lines.index(next(x for x in lines if x.startswith(f"== {name} "))):
                        lines.index(next(x for x in lines if x.startswith(f"{name}: rc=")))]
        assert [x.split()[0] for x in section[-2:]] == ["first", "last"], (name, result.stdout)
        assert (out / f"{name}.log").read_text().splitlines()[-1].startswith("last line of "), name
