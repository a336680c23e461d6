"""OrderedWorkers: input order, errors, dead workers, and no process outliving its parent."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from megatron_zaya.data.workers import OrderedWorkers, WorkerError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _square_after_a_pause(x):
    time.sleep(0.002 * (x % 3))   # later items often finish first
    return x * x


def _fail_on_five(x):
    if x == 5:
        raise ValueError("five is not allowed")
    return x


def _die_on_three(x):
    if x == 3:
        os._exit(7)
    return x


@pytest.mark.parametrize("n", [1, 2, 3])
def test_results_come_back_in_input_order(n):
    with OrderedWorkers(n, _square_after_a_pause) as workers:
        assert list(workers.imap(range(40))) == [x * x for x in range(40)]
        assert len({p.pid for p in workers._procs}) == n


def test_an_exception_in_a_worker_names_it_with_its_traceback():
    with pytest.raises(WorkerError, match="(?s)failed:.*ValueError: five is not allowed"):
        with OrderedWorkers(2, _fail_on_five) as workers:
            list(workers.imap(range(10)))


def test_a_dead_worker_is_an_error_not_a_hang():
    with pytest.raises(WorkerError, match="exited \\(exit code 7\\)"):
        with OrderedWorkers(2, _die_on_three) as workers:
            list(workers.imap(range(10)))


def test_a_worker_killed_while_idle_is_an_error_not_a_broken_pipe():
    with pytest.raises(WorkerError, match="exited \\(exit code -9\\)"):
        with OrderedWorkers(2, abs) as workers:
            assert list(workers.imap([-1, -2])) == [1, 2]
            workers._procs[0].kill()
            workers._procs[0].join()
            list(workers.imap(range(10)))


def test_leaving_the_block_stops_every_worker():
    with OrderedWorkers(2, _square_after_a_pause) as workers:
        procs = list(workers._procs)
        list(workers.imap(range(5)))
    assert all(not p.is_alive() for p in procs)
    with pytest.raises(KeyboardInterrupt):
        with OrderedWorkers(2, _square_after_a_pause) as workers:
            procs = list(workers._procs)
            raise KeyboardInterrupt
    assert all(p.exitcode is not None for p in procs)


def test_workers_leave_when_their_parent_is_killed(tmp_path):
    """SIGKILL on the parent runs no cleanup: the workers must see their pipe close and exit,
    not linger holding the parent's stdout (which would hang whoever reads it)."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {REPO!r})
        from megatron_zaya.data.workers import OrderedWorkers
        w = OrderedWorkers(2, abs)
        print(" ".join(str(p.pid) for p in w._procs), flush=True)
        time.sleep(60)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=30)
    assert parent.stdout.read() == ""          # EOF: no worker holds the pipe open
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def test_workers_busy_when_their_parent_is_killed_leave_without_a_traceback(tmp_path):
    """A worker that finishes its task after the parent died (an out-of-memory kill) meets a broken pipe when it
    sends the result: it leaves quietly, as it does when the pipe closes while it waits (each printed a
    BrokenPipeError traceback into the log, which then pointed at the workers, not the kill)."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import sys, threading, time
        sys.path.insert(0, {REPO!r})
        from megatron_zaya.data.workers import OrderedWorkers

        def slow(x):
            time.sleep(1.0)
            return x

        w = OrderedWorkers(2, slow)
        threading.Thread(target=lambda: list(w.imap(range(4))), daemon=True).start()
        time.sleep(0.3)                  # both workers are inside slow()
        print(" ".join(str(p.pid) for p in w._procs), flush=True)
        time.sleep(60)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    pids = [int(p) for p in parent.stdout.readline().split()]
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=30)
    err = parent.stderr.read()               # EOF once the workers have closed it (they may still be exiting)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)
