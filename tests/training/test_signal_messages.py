"""The preemption signal handler's message (training/signals.py) never fails the run: not when the signal
comes while the rank is blocked writing to a full stderr pipe (`| tee` behind), nor when stderr's reader
is gone. Each case runs in a child process, whose stderr the test controls."""
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Writes log lines to stderr until the monitor has a signal, then says which one on stdout.
# stderr stays block-buffered as without PYTHONUNBUFFERED, so a blocked write holds the stream's lock.
BLOCKED_WRITER = r'''
import sys
from megatron_zaya.training.signals import SignalMonitor
monitor = SignalMonitor(rank=0)
print("writing", flush=True)
while not monitor.pending:
    sys.stderr.write("x" * 8191 + "\n")
print("received", monitor.received, flush=True)
'''

# stderr is a pipe whose reader is gone: the handler's message cannot be written.
GONE_READER = r'''
import os, signal
from megatron_zaya.training.signals import SignalMonitor
read_end, write_end = os.pipe()
os.close(read_end)
os.dup2(write_end, 2)
monitor = SignalMonitor(rank=0)
os.kill(os.getpid(), signal.SIGUSR1)
os.kill(os.getpid(), signal.SIGTERM)
print("received", monitor.received, flush=True)
'''


def _child(code, stderr):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYTHONUNBUFFERED", None)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=stderr, text=True,
                            env=env, cwd=ROOT)


def _wait_until_blocked_in_a_pipe_write(pid, timeout=3.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(f"/proc/{pid}/wchan") as wchan:
                if "pipe_write" in wchan.read():
                    return
        except OSError:
            pass
        time.sleep(0.02)
    time.sleep(0.3)     # no /proc wchan here: the 64 KiB pipe fills within milliseconds anyway


def test_a_signal_during_a_blocked_stderr_write_sets_the_flag_and_says_so():
    child = _child(BLOCKED_WRITER, stderr=subprocess.PIPE)
    try:
        assert child.stdout.readline() == "writing\n"
        _wait_until_blocked_in_a_pipe_write(child.pid)
        child.send_signal(signal.SIGUSR1)
        out, err = child.communicate(timeout=20)       # the reader catches up; the child stops writing
    finally:
        child.kill()
    assert child.returncode == 0, re.sub("x{80,}", "<log line>", err)[-2000:]
    assert out == "received SIGUSR1\n"
    assert "[rank 0] SIGUSR1 received: a checkpoint will be saved at the end of this iteration" in err


def test_a_signal_with_stderr_reader_gone_still_sets_the_flag():
    child = _child(GONE_READER, stderr=None)
    out, err = child.communicate(timeout=20)
    assert (child.returncode, out) == (0, "received SIGUSR1\n")
