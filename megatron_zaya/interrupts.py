"""SIGTERM in the command-line tools: a job's end (scancel, a time limit, a kill) cleans up as Ctrl-C does.

Without a handler SIGTERM ends a Python process at once: no `finally` or `except BaseException` runs, so a
tool writing under a temporary name (a converted checkpoint's hidden folder, a dataset's `.tmp` files)
leaves that behind. Two ways to turn it into the KeyboardInterrupt the cleanup already handles:

- `interrupt_on_sigterm(main, argv, tool)`: SIGTERM raises KeyboardInterrupt wherever the main thread is,
  for tools that run in one process (convert_checkpoint, merge_datasets); the tool then exits 130.
- `StopOnSignal`: SIGTERM and Ctrl-C only set a flag the tool checks between units of work, for tools
  with worker processes (preprocess_data), where an exception raised in the middle of starting a worker
  (inside multiprocessing's bookkeeping, or an import lock's callback) can be lost or leave a half-built
  object behind. A second signal raises at once.

While a finished output replaces an old one, `signals_held()` makes both signals wait (merge_datasets,
train_tokenizer); a signal that comes after is said with what is already in place (`in_place`).

Training (pretrain_zaya.py) has its own handling: a checkpoint, then a clean exit (training/signals.py).

`quiet_when_the_reader_leaves(main)` runs a tool that prints a report so that `tool | head` ends it
without a BrokenPipeError traceback, as `head` ends any other command (SIGPIPE's status, 141); a tool that
writes files too prints with `say`, which goes on without its reader, so the files are still written.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Callable


class StopOnSignal:
    """SIGTERM and Ctrl-C ask for a stop (`pending()`); a second one raises KeyboardInterrupt at once.

    Forked workers inherit the handlers: SIGTERM ends a worker, Ctrl-C (sent to the whole process
    group) is left to the parent, which stops the workers itself. `restore()` puts the previous
    handlers back (a caller importing the tool's main(), as the tests do)."""

    def __init__(self):
        self.received: str | None = None
        self._main_pid = os.getpid()
        self._previous = {}
        if threading.current_thread() is threading.main_thread():   # handlers only install from there
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum, frame):
        if os.getpid() != self._main_pid:
            if signum == signal.SIGTERM:
                os._exit(128 + signum)
            return
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name

    def pending(self) -> bool:
        return self.received is not None

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}


def interrupt_on_sigterm(main: Callable[[list | None], int], argv: list | None, tool: str,
                         in_place: Callable[[], str | None] | None = None) -> int:
    """main(argv) with SIGTERM raising KeyboardInterrupt; an interruption (either signal) prints one line
    naming `tool` and gives exit status 130. The line says "no output written" unless `in_place()` names an
    output already put in place (the point of no return passed: old files replaced), which it then says.
    The previous SIGTERM handler comes back afterwards."""
    installed = threading.current_thread() is threading.main_thread()   # handlers only install from there
    if installed:
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return main(argv)
    except KeyboardInterrupt:
        done = in_place() if in_place is not None else None
        if done:
            print(f"{tool}: interrupted after the output was put in place: {done} (the rest of the run skipped; "
                  f"temporary files removed)", file=sys.stderr)
        else:
            print(f"{tool}: interrupted: no output written (temporary files removed)", file=sys.stderr)
        return 130
    finally:
        if installed:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


@contextlib.contextmanager
def signals_held():
    """SIGINT and SIGTERM wait while the block runs (the renames that put a finished output in place of an old
    one: cut in half, neither would be left whole); yields the list of the names of those that came, for the
    caller to say after the block. Outside the main thread, nothing is held (no handler can be installed)."""
    received: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {signum: signal.signal(signum, lambda signum, frame: received.append(signal.Signals(signum).name))
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def quiet_when_the_reader_leaves(main: Callable[[], int]) -> int:
    """main()'s exit status; 141 without a traceback when standard output's reader is gone (`| head`). Later
    writes (the interpreter's flush at exit) go to /dev/null instead of raising again."""
    try:
        status = main()
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        stdout_to_devnull()
        return 128 + signal.SIGPIPE


def say(text: str = "", stream=None, end: str = "\n") -> None:
    """print to `stream` (standard output by default) and flush; once that stream's reader has gone (`| head`, a
    dead tee) later writes go to /dev/null and the tool goes on, so its output files are still written (a
    BrokenPipeError lost them)."""
    stream = stream or sys.stdout
    try:
        print(text, file=stream, end=end, flush=True)
    except BrokenPipeError:
        stdout_to_devnull(stream)


def stdout_to_devnull(stream=None) -> None:
    """Standard output's (or `stream`'s) reader is gone: later writes (and the interpreter's flush at exit) go
    to /dev/null."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), (stream or sys.stdout).fileno())
