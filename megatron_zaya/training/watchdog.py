"""A per-rank watchdog: when an iteration (or a collective inside it) takes far longer than usual,
dump the stack of every thread to stderr and exit non-zero, so that the launcher restarts the job
from the last checkpoint instead of a hung rank holding the whole allocation.

Timeout = max(--watchdog-min-seconds, --watchdog-timeout-factor x median of the recent iteration times).
Armed when training starts (`arm`), with max(--watchdog-min-seconds, --watchdog-first-iteration-seconds)
for the first iteration (compilation, first collectives); paused during evaluation and checkpoint
saves, which have their own limit, --watchdog-pause-seconds (a save into a stalled file system, an
evaluation on a hung peer): a pause starts the watchdog's thread, also before it is armed (--skip-train)
and after training stopped it (the final and test evaluations). Exit code: WATCHDOG_EXIT_CODE (124, like
timeout(1)).
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import statistics
import sys
import threading
import time
from collections import deque

WATCHDOG_EXIT_CODE = 124


class Watchdog:
    def __init__(self, factor: float = 20.0, min_seconds: float = 600.0, rank: int = 0,
                 poll_seconds: float | None = None, exit_fn=None, pause_seconds: float = 7200.0):
        self.factor, self.min_seconds, self.rank = float(factor), float(min_seconds), rank
        self.pause_seconds = float(pause_seconds)     # the longest evaluation or save; 0: no limit
        shortest = min(self.min_seconds, self.pause_seconds or self.min_seconds)
        self.poll = poll_seconds if poll_seconds is not None else max(0.05, min(5.0, shortest / 20))
        self.durations: deque[float] = deque(maxlen=50)
        self.last_beat: float | None = None
        self.first_limit: float | None = None      # set by arm() until the first beat
        self.paused_depth = 0
        self._pause_started = 0.0
        self.fired = False
        self._exit = exit_fn or os._exit
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.enabled = self.factor > 0 and self.min_seconds > 0

    def timeout(self) -> float:
        if self.first_limit is not None:
            return max(self.min_seconds, self.first_limit)
        typical = statistics.median(self.durations) if self.durations else 0.0
        return max(self.min_seconds, self.factor * typical)

    def arm(self, first_iteration_seconds: float) -> None:
        """Start of training: the clock runs from now; the first iteration may take up to
        max(min_seconds, first_iteration_seconds) and is not counted in the median."""
        if not self.enabled:
            return
        with self._lock:
            self.last_beat, self.first_limit = time.monotonic(), float(first_iteration_seconds)
        self._start()

    def beat(self, trained: bool = True) -> None:
        """End of an iteration; one that trained nothing (--iterations-to-skip: its batch read and dropped)
        restarts the clock only: the first training step keeps its allowance, and the median its steps."""
        if not self.enabled:
            return
        now = time.monotonic()
        with self._lock:
            if not trained:
                self.last_beat = now
            else:
                if self.last_beat is not None and self.paused_depth == 0 and self.first_limit is None:
                    self.durations.append(now - self.last_beat)
                self.last_beat, self.first_limit = now, None
        self._start()

    def _start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="megatron-zaya-watchdog", daemon=True)
            self._thread.start()

    @contextlib.contextmanager
    def paused(self):
        """No timeout inside (evaluation, checkpoint saves), and the pause is not part of the iteration's time:
        when the outermost one ends the clock moves on by its length (restarting it made the iteration that
        evaluated look instant, and with frequent evaluations the median, hence the limit, fell to
        min_seconds); a beat inside restarts it then."""
        with self._lock:
            if self.paused_depth == 0:
                self._pause_started = time.monotonic()
            self.paused_depth += 1
        if self.enabled and self.pause_seconds > 0:
            self._start()
        try:
            yield
        finally:
            with self._lock:
                self.paused_depth -= 1
                if self.paused_depth == 0 and self.last_beat is not None:
                    now = time.monotonic()
                    self.last_beat = now if self.last_beat >= self._pause_started else \
                        self.last_beat + (now - self._pause_started)

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            with self._lock:
                if self.paused_depth:
                    waited, limit = time.monotonic() - self._pause_started, self.pause_seconds or float("inf")
                elif self.last_beat is None:
                    continue
                else:
                    waited, limit = time.monotonic() - self.last_beat, self.timeout()
                paused = self.paused_depth > 0
            if waited > limit:
                self._fire(waited, limit, paused)
                return

    def _fire(self, waited: float, limit: float, paused: bool = False) -> None:
        self.fired = True
        err = sys.stderr
        rule = (f"max(--watchdog-min-seconds {self.min_seconds:g}, --watchdog-first-iteration-seconds "
                f"{self.first_limit:g})" if self.first_limit is not None else
                f"max(--watchdog-min-seconds {self.min_seconds:g}, --watchdog-timeout-factor {self.factor:g} x median "
                f"iteration {(statistics.median(self.durations) if self.durations else 0.0):.3f} s)")
        what = (f"an evaluation or checkpoint save has run for {waited:.1f} s (limit --watchdog-pause-seconds "
                f"{limit:g}); a rank, a collective or the file system is hung" if paused else
                f"no iteration finished for {waited:.1f} s (limit {limit:.1f} s = {rule}); a rank or a collective "
                f"is hung")
        err.write(f"\n[rank {self.rank}] WATCHDOG: {what}. Stacks of every thread of rank {self.rank} "
                  f"(pid {os.getpid()}):\n")
        err.flush()
        try:
            faulthandler.dump_traceback(file=err, all_threads=True)
        except Exception:   # stderr without a file descriptor (captured): dump through Python
            import traceback
            for ident, frame in sys._current_frames().items():
                err.write(f"Thread {ident}:\n{''.join(traceback.format_stack(frame))}\n")
        err.write(f"[rank {self.rank}] WATCHDOG: exiting with code {WATCHDOG_EXIT_CODE} so the launcher can restart "
                  f"from the latest checkpoint\n")
        err.flush()
        self._exit(WATCHDOG_EXIT_CODE)

    def stop(self) -> None:
        """Training is over: no iteration limit from now on (a later pause starts the thread again, for its own)."""
        with self._lock:
            self.last_beat = self.first_limit = None
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
