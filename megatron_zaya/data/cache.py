"""Build-once cache of index arrays as `.npy` files under `--data-cache-path`.

Files are named `{md5 of the description}-{kind}-{name}.npy`, with the description saved beside them
as `{hash}-{kind}-description.json`, written LAST: it marks the entry complete. The first process to
create `{hash}.lock` (O_EXCL) holds an exclusive flock on it, builds and writes (temporary names + rename);
every other process or rank waits for the description file and memory-maps the arrays. A builder touches
its lock every LOCK_HEARTBEAT_S. A lock that no process holds an flock on (the operating system drops a
flock when its process dies, however it dies) is a killed builder's when its host is this one and its
process is gone, or when it has not changed for STALE_LOCK_S (a builder on another node, where flock is per
node, or on a filesystem without one, still touches it): one waiter takes it over (the flock makes it one
process's) and removes that build's temporary files. Works across data-parallel ranks without collective
calls. At a large run's first start a build takes minutes: a waiter says once (the first process of each
node) whom it waits for, and a build longer than SLOW_BUILD_S says how long it took.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import socket
import sys
import time
from typing import Callable

import numpy as np

from megatron_zaya.leftovers import TEMPORARY_SUFFIX_PATTERN, kept_fresh, temporary_suffix
from megatron_zaya.paths import write_refusal
from megatron_zaya.processes import process_running
from megatron_zaya.units import timestamp

FORMAT_VERSION = 1
WAIT_NOTICE_S = 30.0      # a process waiting this long for another's build says so (once)
MAX_POLL_S = 2.0          # a waiter looks for the finished files at most this often at the end of its backoff
SLOW_BUILD_S = 10.0       # a build taking longer says how long, naming its files
LOCK_HEARTBEAT_S = 30.0   # a builder touches its lock file this often (from a thread: a step holding the GIL,
STALE_LOCK_S = 600.0      # as a shuffle of 1e9 samples for a minute, delays it); a lock nobody holds that has
                          # not changed for this long is a dead builder's
_NO_LOCKS = (errno.ENOLCK, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)     # a filesystem without flock


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


def _flock(fd: int, wait: bool) -> bool | None:
    """An exclusive flock on `fd`: True when held, False when another process holds it (`wait` False), None on a
    filesystem without flock."""
    import fcntl
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as err:
        if err.errno in _NO_LOCKS:
            return None
        raise


def _names_file(fd: int, path: str) -> bool:
    """Whether `path` is still the file open as `fd` (a builder removes its lock file when done)."""
    try:
        mine, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def _abandoned(fd: int, observed: dict) -> bool:
    """Whether the lock open as `fd`, which no process holds an flock on (or on a filesystem without flock), is
    a dead builder's: one of this host whose process is gone, or one unchanged for STALE_LOCK_S by this
    process's clock (`observed`: when each state of the file was first seen). A live builder touches its lock
    every LOCK_HEARTBEAT_S: a free flock alone proves nothing where flock is per node (BeeGFS by default, NFS
    mounted nolock, Lustre with localflock) or the builder runs a version that takes none."""
    host, _, pid = os.pread(fd, 256, 0).decode(errors="replace").strip().rpartition(":")
    if host == socket.gethostname() and pid.isdigit() and not process_running(int(pid)):
        return True
    info = os.fstat(fd)
    first_seen = observed.setdefault((info.st_ino, info.st_mtime_ns, info.st_size), time.monotonic())
    return time.monotonic() - first_seen >= STALE_LOCK_S


def _claim(lock_path: str, observed: dict) -> int | None:
    """A descriptor of the entry's lock when this process is to build it, its host:pid written in the file;
    None while another process builds it (or the lock changed hands: look again)."""
    try:
        fd = os.open(lock_path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666)
        new = True
    except FileExistsError:
        try:
            fd = os.open(lock_path, os.O_RDWR)
        except (FileNotFoundError, PermissionError):     # gone (look again), or another user's: wait for it
            return None
        new = False
    try:
        flocked = _flock(fd, wait=new)     # (a new file: a waiter's look at it lasts a moment)
        if flocked is False or not _names_file(fd, lock_path) or not (new or _abandoned(fd, observed)):
            os.close(fd)
            return None
        if flocked is None and not new:    # no flock to make the takeover one process's: removed, then created
            os.close(fd)                   # (two waiters may both get here: the second's lock may be the first's
            with contextlib.suppress(FileNotFoundError):     # new one, and two builds then write alike)
                os.remove(lock_path)
            return None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{socket.gethostname()}:{os.getpid()}".encode(), 0)
        return fd
    except BaseException:
        if new and _names_file(fd, lock_path):      # (an empty new lock would hold the entry for STALE_LOCK_S)
            os.remove(lock_path)
        os.close(fd)
        raise


def _release(lock_path: str, fd: int) -> None:
    try:
        if _names_file(fd, lock_path):
            os.remove(lock_path)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def _remove_killed_builds_files(cache_dir: str, key: str, kind: str) -> None:
    """The temporary files of a killed build of this entry (`KEY-KIND-NAME.tmpPID-TOKEN.npy`, the
    description's `.tmpPID-TOKEN`) that have not changed for STALE_LOCK_S (a live writer's, wrongly taken for
    dead, keeps changing)."""
    pattern = re.compile(re.escape(f"{key}-{kind}-") + r"[\w.]+?" + TEMPORARY_SUFFIX_PATTERN + r"(\.npy)?")
    for name in os.listdir(cache_dir):
        path = os.path.join(cache_dir, name)
        try:
            if pattern.fullmatch(name) and time.time() - os.path.getmtime(path) >= STALE_LOCK_S:
                os.remove(path)
        except OSError:          # gone, or another user's in a shared folder: left (the build does not need it)
            pass


def _build_and_write(build: Callable[[], dict[str, np.ndarray]], base: str, paths: dict, done: str,
                     description: dict) -> None:
    """Build the arrays and write them under temporary names renamed into place, the description last."""
    built_at = time.time()
    if _speaks():       # (a large corpus takes minutes: said before, not only after)
        print(f"{timestamp()} building {base}-*.npy ...", file=sys.stderr, flush=True)
    arrays = build()
    if time.time() - built_at > SLOW_BUILD_S:
        print(f"{timestamp()} built {base}-*.npy in {time.time() - built_at:.0f} s (later runs read them)",
              file=sys.stderr, flush=True)
    suffix = temporary_suffix()
    try:
        for n, p in paths.items():
            np.save(p[:-4] + suffix + ".npy", np.ascontiguousarray(arrays[n]), allow_pickle=False)
            os.replace(p[:-4] + suffix + ".npy", p)
        with open(done + suffix, "w") as f:
            json.dump({"format": FORMAT_VERSION, **description}, f, sort_keys=True, indent=1)
        os.replace(done + suffix, done)
    except BaseException:        # (a full disk, an interrupt): this build's temporary files go with it
        for temporary in [p[:-4] + suffix + ".npy" for p in paths.values()] + [done + suffix]:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temporary)
        raise


_said: set = set()


def _no_space(err: OSError, folder: str) -> OSError:
    """The error of a full disk or quota where the index cache writes, naming the folder as its file (so that
    pretrain_zaya.py prints it as one line) and what to do."""
    return OSError(err.errno, f"the index cache has no space left ({err.strerror}): free space there or give "
                              f"--data-cache-path another folder", folder)


def _cannot_write(folder: str) -> str | None:
    """Why no file can be made in `folder` (a read-only mount, a folder without write permission:
    paths.write_refusal); None when one can. A lock left there, or a writable lock in a folder that is not, would
    otherwise hold every process until the timeout, or fail the build's write."""
    err = write_refusal(folder)
    if err is None:
        return None
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        raise _no_space(err, folder)
    if err.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
        raise err
    return err.strerror


def _say_once(key, message: str) -> None:
    """`message` on stderr, with the time, once per process and `key` (from the rank that speaks, `_speaks`)."""
    if key not in _said and _speaks():
        _said.add(key)
        print(f"{timestamp()} {message}", file=sys.stderr, flush=True)


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
    deadline, noticed, observed = started + timeout_s, False, {}
    if not (os.path.exists(done) and all(os.path.exists(p) for p in paths.values())):
        refused = _cannot_write(cache_dir)
        if refused is not None:    # a read-only folder of indices built beforehand, without this one
            _say_once(cache_dir, f"warning: index cache {cache_dir}: cannot write there ({refused}): the indices "
                      f"not built there are built in memory, by every process, at every start (give "
                      f"--data-cache-path a writable folder to keep them)")
            return build()
    try:
        while True:
            if os.path.exists(done) and all(os.path.exists(p) for p in paths.values()):
                return load()
            fd = _claim(lock, observed)
            if fd is None:
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
                if os.path.exists(done) and all(os.path.exists(p) for p in paths.values()):
                    return load()  # someone finished between our check and the lock
                _remove_killed_builds_files(cache_dir, key, kind)
                with kept_fresh(lock, every=LOCK_HEARTBEAT_S):      # (a waiter sees the build alive: _abandoned)
                    _build_and_write(build, base, paths, done, description)
            finally:
                _release(lock, fd)
            return load()
    except OSError as err:       # a full disk or quota: the lock's write or the arrays' (blocks, not inodes)
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _no_space(err, cache_dir) from None
        raise
