"""Preemption signals: SIGTERM / SIGUSR1 (Slurm's warning before a time limit or preemption, and
what torchrun forwards on shutdown) and Ctrl-C (SIGINT; torchrun and srun pass it on to every rank)
only set a flag here; the training loop notices it at the end of the iteration (every rank agrees
with one all-reduce), saves a checkpoint and exits cleanly, so a run stopped by hand loses nothing
since its last checkpoint either.

A second SIGTERM or SIGUSR1 while the first is still being handled is logged and ignored: the save in
progress must not be cut short by an impatient resend. A second Ctrl-C is a person asking to stop at
once: it raises KeyboardInterrupt as Python would (a save cut short leaves the previous checkpoint;
the atomic checkpoint protocol of megatron_zaya.checkpoint.format covers it, as it covers SIGKILL,
which cannot be caught). So does a SIGTERM after a Ctrl-C: torchrun passes a person's second Ctrl-C
on to its ranks as SIGTERM. The handler's message never fails the run: a console pipe that is gone
(`| tee` killed by the same Ctrl-C) loses the line, not the checkpoint, and a signal that comes while the
rank is blocked writing to a full one (`| tee` behind) is said once the pipe drains.
"""
from __future__ import annotations

import os
import signal
import threading
import time

DEFAULT_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")


def _say(message: str) -> None:
    """The message straight to file descriptor 2, never through sys.stderr: a signal that comes while the main
    thread is blocked writing to stderr (a full pipe: `| tee` behind, a slow terminal) runs the handler inside
    that stream's lock, where a second write raises RuntimeError ('reentrant call'). Nothing here raises: a
    closed or broken stderr loses the message, and the save goes on."""
    try:
        data = message.encode("utf-8", "replace")
        while data:
            written = os.write(2, data)
            if written <= 0:
                break
            data = data[written:]
    except Exception:
        pass


class SignalMonitor:
    def __init__(self, names=DEFAULT_SIGNALS, rank: int = 0):
        self.rank = rank
        self.received: str | None = None
        self.received_at: float | None = None
        self._previous = {}
        self._pid = os.getpid()
        if threading.current_thread() is not threading.main_thread():
            return          # signal handlers can only be installed from the main thread
        for name in names:
            signum = getattr(signal, name, None)
            if signum is None:
                continue
            self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:
        if os.getpid() != self._pid:   # a forked DataLoader worker (a signal to the whole process group):
            return                     # the rank stops it once saved; ending now would break that save
        name = signal.Signals(signum).name
        if self.received is None:
            self.received, self.received_at = name, time.time()
            again = " (Ctrl-C again to stop at once, without it)" if name == "SIGINT" else ""
            _say(f"[rank {self.rank}] {name} received: a checkpoint will be saved at the end of this iteration, "
                 f"then the run exits{again}\n")
        elif name == "SIGINT" or (name == "SIGTERM" and self.received == "SIGINT"):
            raise KeyboardInterrupt
        else:
            _say(f"[rank {self.rank}] {name} received again while handling {self.received}: ignored\n")

    @property
    def pending(self) -> bool:
        return self.received is not None

    def restore(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self._previous.items():
            try:
                signal.signal(signum, handler)
            except (TypeError, ValueError):
                pass
        self._previous = {}
