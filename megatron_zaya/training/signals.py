"""Preemption signals: SIGTERM / SIGUSR1 (Slurm's warning before a time limit or preemption, and
what torchrun forwards on shutdown) only set a flag here; the training loop notices it at the end of
the iteration (every rank agrees with one all-reduce), saves a checkpoint and exits cleanly.

A second signal of the same kind while the first is still being handled is logged and ignored: the
save in progress must not be cut short by an impatient resend. SIGKILL cannot be caught - the
atomic checkpoint protocol (megatron_zaya.checkpoint.format) covers it.
"""
from __future__ import annotations

import signal
import sys
import threading
import time

DEFAULT_SIGNALS = ("SIGTERM", "SIGUSR1")


class SignalMonitor:
    def __init__(self, names=DEFAULT_SIGNALS, rank: int = 0):
        self.rank = rank
        self.received: str | None = None
        self.received_at: float | None = None
        self._previous = {}
        if threading.current_thread() is not threading.main_thread():
            return          # signal handlers can only be installed from the main thread
        for name in names:
            signum = getattr(signal, name, None)
            if signum is None:
                continue
            self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.received is None:
            self.received, self.received_at = name, time.time()
            sys.stderr.write(f"[rank {self.rank}] {name} received: a checkpoint will be saved at the end of this "
                             f"iteration, then the run exits\n")
        else:
            sys.stderr.write(f"[rank {self.rank}] {name} received again while handling {self.received}: ignored\n")
        sys.stderr.flush()

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
