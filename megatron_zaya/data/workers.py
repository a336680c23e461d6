"""A fixed set of worker processes that map a function over a stream, results in input order.

Why not `multiprocessing.Pool`: its worker-handler thread replaces workers that exit, and during a
shutdown (SIGTERM, Ctrl-C) it can fork a replacement after the pool was told to stop. That new
worker no Pool owns: it blocks forever on the task queue's lock, holding the caller's stdout and
stderr open, so whoever waits on them (a shell pipe, a CI runner) hangs. Here each worker is
started once, has its own pipe (no shared locks), and leaves on its own when the pipe's other end
closes, so an interrupted or killed parent never leaves one behind.

Each worker has at most one task at a time: with two, a worker blocked sending a large result and
the parent blocked sending it the next task would wait on each other.
"""

from __future__ import annotations

import collections
import multiprocessing as mp
import traceback
from typing import Any, Callable, Iterable, Iterator


class WorkerError(RuntimeError):
    """A worker raised an exception the mapped function did not turn into a result, or died."""


def _worker_loop(conn, inherited, initializer, initargs, fn):
    for c in inherited:   # other workers' parent ends, copied by fork: without closing them, no EOF
        c.close()
    try:
        if initializer is not None:
            initializer(*initargs)
        while True:
            try:
                task = conn.recv()
            except (EOFError, OSError):   # the parent closed its end or died: leave
                return
            if task is None:
                return
            try:
                result = ("ok", fn(task))
            except Exception:
                result = ("error", traceback.format_exc())
            try:
                conn.send(result)
            except OSError:               # the parent died (SIGKILL, the OOM killer): leave without a traceback
                return
    except KeyboardInterrupt:
        return
    finally:
        conn.close()


class OrderedWorkers:
    """`n` processes running `fn`; `imap(items)` yields `fn(item)` in the order of `items`.

    Use as a context manager: leaving normally stops the workers, leaving by an exception (or an
    interrupt) kills them. Nothing else in the calling process (its other children) is touched.
    """

    def __init__(self, n: int, fn: Callable[[Any], Any], initializer: Callable | None = None,
                 initargs: tuple = (), context=None):
        if n < 1:
            raise ValueError(f"need at least one worker, got {n}")
        ctx = context or (mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context())
        self._procs: list = []
        self._conns: list = []
        try:
            for _ in range(n):
                parent_end, child_end = ctx.Pipe(duplex=True)
                inherited = self._conns + [parent_end]
                proc = ctx.Process(target=_worker_loop, daemon=True,
                                   args=(child_end, inherited, initializer, initargs, fn))
                self._conns.append(parent_end)
                self._procs.append(proc)
                proc.start()
                child_end.close()
        except BaseException:
            self.kill()
            raise

    def imap(self, items: Iterable[Any]) -> Iterator[Any]:
        n = len(self._procs)
        busy: collections.deque[int] = collections.deque()   # workers holding a task, oldest first
        for i, item in enumerate(items):
            if len(busy) == n:
                yield self._receive(busy.popleft())
            worker = i % n   # round robin: the worker just freed (or never used yet)
            try:
                self._conns[worker].send(item)
            except OSError:   # it died while idle
                raise self._died(worker) from None
            busy.append(worker)
        while busy:
            yield self._receive(busy.popleft())

    def _receive(self, worker: int):
        try:
            status, value = self._conns[worker].recv()
        except (EOFError, OSError):
            raise self._died(worker) from None
        if status == "error":
            raise WorkerError(f"worker process {worker} failed:\n{value}")
        return value

    def _died(self, worker: int) -> WorkerError:
        self._procs[worker].join(timeout=5)
        return WorkerError(f"worker process {worker} exited (exit code {self._procs[worker].exitcode})")

    def close(self) -> None:
        """Ask every worker to leave and wait for it (killing one that does not leave in 10 s)."""
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self._procs:
            proc.join(timeout=10)
        self.kill()

    def kill(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        for proc in self._procs:
            if proc.pid is not None:
                proc.join()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.kill()
        return False
