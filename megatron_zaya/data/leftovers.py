"""Temporary files that a killed dataset writer left behind, found and removed by the next run.

An `IndexedDatasetWriter` writes `PREFIX.bin.tmpPID` (and `.lengths`, `.docs`, `.idx` beside it) and
removes them on any error or interrupt; a SIGKILL (the OOM killer, a job past its time limit, a lost
node) gives it no chance, and the `.bin` part is as large as the tokens written so far. The next
writer of the same prefix removes the files of a process that no longer exists on this machine and
whose files have not changed for `QUIET_SECONDS` (a run on another machine sharing the folder may be
writing them: its process is not visible from here, but its files keep changing). Files of other
prefixes, and of live processes, are never touched.
"""
from __future__ import annotations

import os
import re
import sys
import time
from typing import Callable

QUIET_SECONDS = 600


def leftover_temporaries(path_prefix: str) -> tuple[list[str], list[str]]:
    """(removable, recent): temporary files of `path_prefix` from processes other than this one that no
    longer exist here; `recent` are those of a process whose files changed in the last QUIET_SECONDS."""
    from megatron_zaya.data.indexed import temporary_paths

    own = temporary_paths(path_prefix)
    suffix = f".tmp{os.getpid()}"
    bases = [os.path.basename(p[:-len(suffix)]) for p in own]
    pattern = re.compile("(" + "|".join(re.escape(b) for b in bases) + r")\.tmp(\d+)")
    folder = os.path.dirname(own[0]) or "."
    by_process: dict[int, list[str]] = {}
    if not os.path.isdir(folder):   # a new output folder: nothing was left in it
        return [], []
    for entry in os.scandir(folder):
        match = pattern.fullmatch(entry.name)
        if match and int(match.group(2)) != os.getpid():
            by_process.setdefault(int(match.group(2)), []).append(entry.path)
    removable, recent = [], []
    now = time.time()
    for pid, paths in sorted(by_process.items()):
        if _running(pid):
            continue
        changed = max((_mtime(p) for p in paths), default=0.0)
        (recent if now - changed < QUIET_SECONDS else removable).extend(sorted(paths))
    return removable, recent


def remove_leftover_temporaries(path_prefix: str, log: Callable[[str], None] | None = None) -> int:
    """Remove what `leftover_temporaries` finds removable, one log line for it and one for the recent
    files it leaves; returns the bytes freed."""
    log = log or (lambda line: print(line, file=sys.stderr))
    removable, recent = leftover_temporaries(path_prefix)
    freed = 0
    for path in removable:
        try:
            size = os.path.getsize(path)
            os.remove(path)
            freed += size
        except FileNotFoundError:   # another writer of the prefix got there first
            pass
    if removable:
        log(f"removed {len(removable)} temporary file(s) of {path_prefix} left by a killed earlier run "
            f"({freed / 2**20:,.1f} MiB): {', '.join(os.path.basename(p) for p in removable)}")
    if recent:
        log(f"left {len(recent)} temporary file(s) of {path_prefix} in place: their process is not running here "
            f"but they changed in the last {QUIET_SECONDS // 60} minutes (a run on another machine?); remove them "
            f"once no run writes this dataset: {', '.join(recent)}")
    return freed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # exists, another user's
        return True
    except OSError:   # no such check on this platform: assume it runs
        return True
    return True


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except FileNotFoundError:
        return 0.0
