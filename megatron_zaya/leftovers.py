"""Temporary files and folders that a killed writer left behind, found and removed by the next run.

Writers here work under temporary names that carry their process id (a dataset's `PREFIX.bin.tmpPID-TOKEN`
beside `.lengths`, `.docs` and `.idx`, TOKEN drawn once per process (`temporary_suffix`: processes on two
machines sharing the folder may have the same id, in containers); a Hugging Face folder's hidden
`.NAME.tmpPID-XXXX`; train_tokenizer's `.NAME.train_tokenizer.tmpPID-XXXX`; the quickstart corpus's
`OUTPUT.tmpPID-TOKEN`) and remove them on any error or interrupt. A SIGKILL (the OOM killer, a job past its time
limit, a lost node) gives them no chance, and what stays is as large as what was written. The next writer of
the same output removes the leftovers of a process that no longer exists on this machine and whose files have
not changed for `QUIET_SECONDS` (a run on another machine sharing the folder may be writing them: its process
is not visible from here, but its files keep changing; a writer whose files stay unchanged for long, as
train_tokenizer's folder while SentencePiece trains, touches them every HEARTBEAT_SECONDS: `kept_fresh`).
Other outputs' files, and a live process's, are never touched.
"""
from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import sys
import threading
import time
from typing import Callable

from megatron_zaya.processes import process_running

from megatron_zaya.units import human_bytes

QUIET_SECONDS = 600
HEARTBEAT_SECONDS = 60       # kept_fresh: well inside QUIET_SECONDS, so a live writer's files are never quiet
# `temporary_suffix()` in a leftovers pattern: the process id, then the token (absent in older writers' names)
TEMPORARY_SUFFIX_PATTERN = r"\.tmp(?P<pid>\d+)(?:-[0-9a-f]+)?"
_PROCESS_TOKEN = secrets.token_hex(4)


def temporary_suffix() -> str:
    """`.tmpPID-TOKEN`, what makes a temporary file this process's own. The process id finds the leftovers of a
    killed writer; the token, drawn once per process, keeps apart two processes of one id on machines that share
    the folder (containers number their processes alike): they wrote into the same files, a corrupt output."""
    return f".tmp{os.getpid()}-{_PROCESS_TOKEN}"


@contextlib.contextmanager
def kept_fresh(path: str, every: float | None = None):
    """While the block runs, a daemon thread sets the modification time of `path` to now every `every` seconds
    (HEARTBEAT_SECONDS by default), so that a writer whose files stay unchanged for long (train_tokenizer's
    folder stays empty while SentencePiece trains) is not taken for a killed one by a run on another machine
    (find_leftovers: quiet for QUIET_SECONDS)."""
    stop = threading.Event()
    every = HEARTBEAT_SECONDS if every is None else every

    def beat():
        while not stop.wait(every):
            try:
                os.utime(path)
            except OSError:       # gone, or not ours to touch: the run goes on
                pass

    thread = threading.Thread(target=beat, name=f"kept_fresh {path}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def find_leftovers(folder: str, pattern: re.Pattern) -> tuple[list[str], list[str]]:
    """(removable, recent): the entries of `folder` whose whole name matches `pattern` (its group "pid":
    the writer's process id), of processes other than this one that no longer exist here; `recent`
    are those of a process whose files changed in the last QUIET_SECONDS."""
    by_process: dict[int, list[str]] = {}
    if not os.path.isdir(folder):   # a new output folder: nothing was left in it
        return [], []
    for entry in os.scandir(folder):
        match = pattern.fullmatch(entry.name)
        if match and int(match.group("pid")) != os.getpid():
            by_process.setdefault(int(match.group("pid")), []).append(entry.path)
    removable, recent = [], []
    now = time.time()
    for pid, paths in sorted(by_process.items()):
        if process_running(pid):
            continue
        changed = max(_newest_change(p) for p in paths)
        (recent if now - changed < QUIET_SECONDS else removable).extend(sorted(paths))
    return removable, recent


def remove_leftovers(folder: str, pattern: re.Pattern, output: str,
                     log: Callable[[str], None] | None = None) -> int:
    """Remove what `find_leftovers` finds removable; one log line for what was removed, one for what could
    not be (the run goes on) and one for the recent entries left (`output` names what they were written
    for). Returns the bytes freed."""
    log = log or (lambda line: print(line, file=sys.stderr))
    removable, recent = find_leftovers(folder, pattern)
    freed, removed, failed = 0, [], []
    for path in removable:
        size = _size(path)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        except FileNotFoundError:   # another writer of the output got there first
            continue
        except OSError as err:      # not a reason to fail this run: said, and left
            failed.append(f"{path} ({err.strerror or err})")
            continue
        freed += size
        removed.append(os.path.basename(path))
    if removed:
        log(f"removed {len(removed)} temporary file(s) of {output} left by a killed earlier run "
            f"({human_bytes(freed)}): {', '.join(removed)}")
    if failed:
        log(f"could not remove temporary file(s) of {output} left by a killed earlier run: {', '.join(failed)}")
    if recent:
        log(f"left {len(recent)} temporary file(s) of {output} in place: their process is not running here "
            f"but they changed in the last {QUIET_SECONDS // 60} minutes (a run on another machine?); remove them "
            f"once no run writes {output}: {', '.join(recent)}")
    return freed


def _walk(path: str):
    """`path` and, for a folder, every file under it."""
    yield path
    if os.path.isdir(path) and not os.path.islink(path):
        for root, _, files in os.walk(path):
            yield from (os.path.join(root, f) for f in files)


def _newest_change(path: str) -> float:
    times = [0.0]
    for p in _walk(path):
        try:
            times.append(os.lstat(p).st_mtime)
        except FileNotFoundError:
            pass
    return max(times)


def _size(path: str) -> int:
    total = 0
    for p in _walk(path):
        try:
            total += os.lstat(p).st_size if not os.path.isdir(p) else 0
        except FileNotFoundError:
            pass
    return total
