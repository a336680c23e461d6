"""Build-once cache of index arrays as `.npy` files under `--data-cache-path`.

Files are named `{md5 of the description}-{kind}-{name}.npy`, with the description saved beside them
as `{hash}-{kind}-description.json`, written LAST: it marks the entry complete. The first process to
create `{hash}.lock` (O_EXCL) builds and writes (temporary names + rename); every other process or
rank waits for the description file and memory-maps the arrays. A lock left by a dead process on
the same host is taken over. Works across data-parallel ranks without collective calls. At a large run's
first start a build takes minutes: a waiter says once (the first process of each node) whom it waits
for, and a build longer than SLOW_BUILD_S says how long it took.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from typing import Callable

import numpy as np

from megatron_zaya.processes import process_running
from megatron_zaya.units import timestamp

FORMAT_VERSION = 1
WAIT_NOTICE_S = 30.0      # a process waiting this long for another's build says so (once)
MAX_POLL_S = 2.0          # a waiter looks for the finished files at most this often at the end of its backoff
SLOW_BUILD_S = 10.0       # a build taking longer says how long, naming its files


def _speaks() -> bool:
    """Only the first process of a node prints waiting notices (all its ranks wait on one builder)."""
    from megatron_zaya.parallel.launch import detect_launcher
    return detect_launcher().local_rank == 0


def _holder(lock_path: str) -> str:
    try:
        with open(lock_path) as f:
            return "process " + f.read().strip().replace(":", " pid ")
    except OSError:
        return "another process"


def build_order(items: list, per_node: bool = False, start: int | None = None) -> list:
    """`items` (entries to build or wait for, in the same order on every process) rotated to start at this
    process's own position, so that at a first start several processes build at once instead of all waiting
    for one: each rank its own (its launcher rank), or with `per_node` each node its own (a hash of its
    host name, whatever the launcher's rank placement; two nodes may draw the same one). A node's processes
    then move through the list together, so a node makes one build at a time, for builds that need much
    memory. `start`: a given position instead."""
    if not items:
        return items
    if start is None:
        if per_node:
            start = int.from_bytes(hashlib.blake2b(socket.gethostname().encode(), digest_size=8).digest(), "little")
        else:
            from megatron_zaya.parallel.launch import detect_launcher
            start = detect_launcher().rank
    start %= len(items)
    return items[start:] + items[:start]


def description_hash(description: dict) -> str:
    text = json.dumps({"format": FORMAT_VERSION, **description}, sort_keys=True, indent=1)
    return hashlib.md5(text.encode("utf-8")).hexdigest()


def array_digest(*arrays: np.ndarray, chunk_bytes: int = 1 << 24) -> str:
    """blake2b of the raw bytes of `arrays` (memory maps included), read `chunk_bytes` at a time."""
    h = hashlib.blake2b(digest_size=16)
    for arr in arrays:
        buf = memoryview(np.ascontiguousarray(arr)).cast("B")
        h.update(f"{arr.dtype.str}:{arr.size};".encode())
        for i in range(0, len(buf), chunk_bytes):
            h.update(buf[i:i + chunk_bytes])
    return h.hexdigest()


def _lock_is_stale(lock_path: str) -> bool:
    try:
        with open(lock_path) as f:
            host, pid = f.read().strip().rsplit(":", 1)
        return host == socket.gethostname() and not process_running(int(pid))
    except (OSError, ValueError):
        return False


def cached_arrays(cache_dir: str | None, kind: str, description: dict, names: list[str],
                  build: Callable[[], dict[str, np.ndarray]], timeout_s: float = 3600.0,
                  poll_s: float = 0.05) -> dict[str, np.ndarray]:
    """Return arrays `names` built by `build()`, cached under `cache_dir` (None: no caching). A waiter looks
    for the finished files `poll_s` after its first look, then half as often again each time, up to every
    MAX_POLL_S: a thousand ranks waiting minutes for a build would otherwise ask a shared file system's
    metadata server 20,000 times a second."""
    if cache_dir is None:
        return build()
    os.makedirs(cache_dir, exist_ok=True)
    key = description_hash(description)
    base = os.path.join(cache_dir, f"{key}-{kind}")
    paths = {n: f"{base}-{n}.npy" for n in names}
    done = f"{base}-description.json"
    lock = os.path.join(cache_dir, f"{key}.lock")

    def load() -> dict[str, np.ndarray]:
        return {n: np.load(p, mmap_mode="r", allow_pickle=False) for n, p in paths.items()}

    started = time.time()
    deadline, noticed = started + timeout_s, False
    while True:
        if os.path.exists(done) and all(os.path.exists(p) for p in paths.values()):
            return load()
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _lock_is_stale(lock):
                try:
                    os.remove(lock)
                except FileNotFoundError:
                    pass
                continue
            if not noticed and time.time() - started > WAIT_NOTICE_S:
                noticed = True
                if _speaks():
                    print(f"{timestamp()} waiting for {_holder(lock)} to build {base}-*.npy (its lock: {lock})",
                          file=sys.stderr, flush=True)
            if time.time() > deadline:
                raise TimeoutError(
                    f"--data-cache-path {cache_dir}: waited {timeout_s:.0f}s for another process to build "
                    f"{base}-*.npy (lock {lock}); remove the lock if its builder died"
                )
            time.sleep(poll_s)
            poll_s = min(poll_s * 1.5, max(poll_s, MAX_POLL_S))
            continue
        try:
            with os.fdopen(fd, "w") as f:
                f.write(f"{socket.gethostname()}:{os.getpid()}")
            if os.path.exists(done) and all(os.path.exists(p) for p in paths.values()):
                return load()  # someone finished between our check and the lock
            built_at = time.time()
            if _speaks():       # (a large corpus takes minutes: said before, not only after)
                print(f"{timestamp()} building {base}-*.npy ...", file=sys.stderr, flush=True)
            arrays = build()
            if time.time() - built_at > SLOW_BUILD_S:
                print(f"{timestamp()} built {base}-*.npy in {time.time() - built_at:.0f} s (later runs read them)",
                      file=sys.stderr, flush=True)
            tmp_suffix = f".tmp{os.getpid()}.npy"
            for n, p in paths.items():
                np.save(p[:-4] + tmp_suffix, np.ascontiguousarray(arrays[n]), allow_pickle=False)
                os.replace(p[:-4] + tmp_suffix, p)
            with open(done + f".tmp{os.getpid()}", "w") as f:
                json.dump({"format": FORMAT_VERSION, **description}, f, sort_keys=True, indent=1)
            os.replace(done + f".tmp{os.getpid()}", done)
        finally:
            try:
                os.remove(lock)
            except FileNotFoundError:
                pass
        return load()
