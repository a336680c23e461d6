"""The index cache (megatron_zaya/data/cache.py): one build per entry across processes, the build lock (flock,
heartbeat, the takeover of a dead builder's lock on this or another node), the waiters' notices and backoff."""
import multiprocessing as mp
import os
import time

import numpy as np
import pytest

from megatron_zaya.data.cache import cached_arrays


def test_array_digest_is_chunk_independent():
    from megatron_zaya.data.cache import array_digest

    a = np.arange(100_000, dtype=np.int32)
    assert array_digest(a) == array_digest(a, chunk_bytes=4096) == array_digest(a, chunk_bytes=7)
    b = a.copy()
    b[5], b[6] = b[6], b[5]
    assert array_digest(b) != array_digest(a)
    assert array_digest(a.astype(np.int64)) != array_digest(a)


def _racer(cache_dir, counter, results, rank):
    def build():
        with counter.get_lock():
            counter.value += 1
        time.sleep(0.3)
        return {"x": np.arange(10) * 3}

    out = cached_arrays(cache_dir, "Test", {"k": 1}, ["x"], build, poll_s=0.01)
    results[rank] = int(out["x"].sum())


def test_only_one_process_builds(tmp_path):
    ctx = mp.get_context("fork")
    counter = ctx.Value("i", 0)
    results = ctx.Array("i", 4)
    procs = [ctx.Process(target=_racer, args=(str(tmp_path / "c"), counter, results, r)) for r in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(20)
    assert all(p.exitcode == 0 for p in procs)
    assert counter.value == 1 and list(results) == [135] * 4
    assert not any(f.endswith(".lock") for f in os.listdir(tmp_path / "c"))


def test_a_long_wait_and_a_slow_build_are_said(tmp_path, monkeypatch, capsys):
    from megatron_zaya.data import cache
    from megatron_zaya.data.cache import description_hash
    d = tmp_path / "c"
    d.mkdir()
    lock = d / f"{description_hash({'k': 3})}.lock"
    holder = held_lock(lock, "otherhost:4242")          # another node's live builder
    monkeypatch.setattr(cache, "WAIT_NOTICE_S", 0.0)
    with pytest.raises(TimeoutError):
        cached_arrays(str(d), "Test", {"k": 3}, ["x"], lambda: {"x": np.ones(3)}, timeout_s=0.2, poll_s=0.01)
    err = capsys.readouterr().err
    assert err.count("waiting for process otherhost pid 4242 to build") == 1 and str(lock) in err, err
    os.close(holder)
    lock.unlink()
    monkeypatch.setattr(cache, "SLOW_BUILD_S", -1.0)
    cached_arrays(str(d), "Test", {"k": 3}, ["x"], lambda: {"x": np.ones(3)})
    assert "-Test-*.npy in 0 s (later runs read them)" in capsys.readouterr().err


def test_a_waiter_looks_less_and_less_often(tmp_path, monkeypatch):
    """Waiting for another node's build, a process looks 0.05 s after its first look, then 1.5x less often
    each time, up to every MAX_POLL_S: about 40 looks in a minute instead of 1,200."""
    from megatron_zaya.data import cache
    from megatron_zaya.data.cache import description_hash
    d = tmp_path / "c"
    d.mkdir()
    holder = held_lock(d / f"{description_hash({'k': 4})}.lock", "otherhost:4242")
    clock, sleeps = [1000.0], []
    monkeypatch.setattr(cache.time, "time", lambda: clock[0])
    monkeypatch.setattr(cache.time, "sleep", lambda s: sleeps.append(s) or clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(cache, "WAIT_NOTICE_S", 1e9)
    with pytest.raises(TimeoutError):
        cached_arrays(str(d), "Test", {"k": 4}, ["x"], lambda: {"x": np.ones(3)}, timeout_s=60.0)
    assert sleeps[:3] == pytest.approx([0.05, 0.075, 0.1125]) and max(sleeps) == cache.MAX_POLL_S
    assert 30 < len(sleeps) < 50
    os.close(holder)


def held_lock(path, holder: str) -> int:
    """A build lock held (flock) through a descriptor of this process: a live builder for cached_arrays, whose
    own descriptor of the file is another open file (flock locks conflict between the two)."""
    import fcntl
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, holder.encode())
    return fd


def test_a_killed_builders_lock_of_any_host_is_taken_over_and_its_files_removed(tmp_path, monkeypatch):
    """A builder killed on another node (a requeued job lands elsewhere) left its lock file and a temporary
    .npy: nobody holds the lock's flock and it stays unchanged, so the next run builds once STALE_LOCK_S has
    passed (it waited an hour, then failed), and removes the stale temporary files (old and new names). The
    build's own files and other entries' are kept."""
    from megatron_zaya.data import cache
    from megatron_zaya.data.cache import description_hash
    monkeypatch.setattr(cache, "STALE_LOCK_S", 0.3)
    d = tmp_path / "c"
    d.mkdir()
    key = description_hash({"k": 5})
    (d / f"{key}.lock").write_text("othernode:1")
    (d / f"{key}-Test-x.tmp1-0a1b.npy").write_bytes(b"partial")
    (d / f"{key}-Test-description.json.tmp1").write_text("{")
    (d / f"{description_hash({'k': 6})}-Test-x.tmp1.npy").write_bytes(b"another entry's")
    for path in d.iterdir():
        os.utime(path, (time.time() - 10,) * 2)
    started = time.time()
    out = cached_arrays(str(d), "Test", {"k": 5}, ["x"], lambda: {"x": np.ones(3)}, timeout_s=30, poll_s=0.01)
    assert out["x"].tolist() == [1, 1, 1] and time.time() - started < 5
    assert sorted(os.listdir(d)) == sorted([f"{key}-Test-x.npy", f"{key}-Test-description.json",
                                            f"{description_hash({'k': 6})}-Test-x.tmp1.npy"])


def _hold_then_die(lock, ready):
    held_lock(lock, f"othernode:{os.getpid()}")
    ready.set()
    time.sleep(60)


def test_a_builder_is_waited_for_until_it_dies_then_replaced_by_one_process(tmp_path, monkeypatch):
    """A live builder's lock is waited for; when it is killed (SIGKILL), exactly one of the waiters builds."""
    from megatron_zaya.data import cache
    from megatron_zaya.data.cache import description_hash
    monkeypatch.setattr(cache, "STALE_LOCK_S", 0.3)
    ctx = mp.get_context("fork")
    cache_dir = tmp_path / "c"
    cache_dir.mkdir()
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_then_die, args=(str(cache_dir / f"{description_hash({'k': 1})}.lock"), ready))
    holder.start()
    assert ready.wait(20)
    counter, results = ctx.Value("i", 0), ctx.Array("i", 3)
    procs = [ctx.Process(target=_racer, args=(str(cache_dir), counter, results, r)) for r in range(3)]
    for p in procs:
        p.start()
    time.sleep(0.5)
    assert counter.value == 0 and all(p.is_alive() for p in procs)        # waiting on the live builder
    holder.kill()
    holder.join()
    for p in procs:
        p.join(20)
    assert all(p.exitcode == 0 for p in procs)
    assert counter.value == 1 and list(results) == [135] * 3


def test_stale_lock_is_taken_over(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    from megatron_zaya.data.cache import description_hash
    import socket

    p = ctx_dead_pid()
    (d / f"{description_hash({'k': 2})}.lock").write_text(f"{socket.gethostname()}:{p}")
    out = cached_arrays(str(d), "Test", {"k": 2}, ["x"], lambda: {"x": np.ones(3)}, timeout_s=5)
    assert out["x"].tolist() == [1, 1, 1]


def _build_slowly(cache_dir, counter, results, rank, per_node_flock):
    from megatron_zaya.data import cache
    if per_node_flock:         # this process runs on another node where flock is per node: it always gets it
        cache._flock = lambda fd, wait: True

    def build():
        with counter.get_lock():
            counter.value += 1
        time.sleep(1.5)
        return {"x": np.arange(10) * 3}
    results[rank] = int(cached_arrays(cache_dir, "Test", {"k": 7}, ["x"], build, poll_s=0.01)["x"].sum())


def test_a_live_builder_is_not_taken_over_where_flock_is_per_node(tmp_path, monkeypatch):
    """On BeeGFS (by default), NFS mounted nolock or Lustre with localflock, a process on another node gets the
    lock's flock while its builder lives: the builder's heartbeat keeps the lock changing, so the other waits
    (it took the build over and deleted the live builder's files, which then failed)."""
    from megatron_zaya.data import cache
    monkeypatch.setattr(cache, "LOCK_HEARTBEAT_S", 0.05)
    monkeypatch.setattr(cache, "STALE_LOCK_S", 0.5)
    ctx = mp.get_context("fork")
    counter, results = ctx.Value("i", 0), ctx.Array("i", 2)
    builder = ctx.Process(target=_build_slowly, args=(str(tmp_path), counter, results, 0, False))
    builder.start()
    while counter.value == 0:
        time.sleep(0.01)
    other = ctx.Process(target=_build_slowly, args=(str(tmp_path), counter, results, 1, True))
    other.start()
    for p in (builder, other):
        p.join(30)
    assert builder.exitcode == other.exitcode == 0
    assert counter.value == 1 and list(results) == [135, 135]


def test_another_users_lock_is_waited_for(tmp_path, monkeypatch):
    """A lock file this process may not open for writing (another user's, in a shared cache folder) is waited
    for, not a PermissionError traceback."""
    from megatron_zaya.data.cache import description_hash
    lock = str(tmp_path / f"{description_hash({'k': 8})}.lock")
    held = held_lock(lock, "othernode:1")
    real_open = os.open

    def as_another_user(path, flags, *args):
        if path == lock and flags & os.O_RDWR and not flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args)
    monkeypatch.setattr(os, "open", as_another_user)
    with pytest.raises(TimeoutError):
        cached_arrays(str(tmp_path), "Test", {"k": 8}, ["x"], lambda: {"x": np.ones(3)}, timeout_s=0.2,
                      poll_s=0.01)
    os.close(held)


def test_lock_edge_cases_end_in_a_build_not_a_traceback_or_a_left_lock(tmp_path, monkeypatch):
    """Without flock, a dead lock another waiter removed first (it was a FileNotFoundError); a stale temporary
    file this process may not remove (another user's in a shared folder: left, the build goes on); an error
    while taking the lock leaves no empty lock behind (the next run waited STALE_LOCK_S for nobody)."""
    import errno
    from megatron_zaya.data import cache
    from megatron_zaya.data.cache import description_hash
    ones = lambda: {"x": np.ones(3)}      # noqa: E731
    key = description_hash({"k": 9})
    (tmp_path / f"{key}.lock").write_text("othernode:1")
    monkeypatch.setattr(cache, "_flock", lambda fd, wait: None)

    def removed_by_another_waiter(fd, observed):
        os.remove(tmp_path / f"{key}.lock")
        return True
    monkeypatch.setattr(cache, "_abandoned", removed_by_another_waiter)
    assert cached_arrays(str(tmp_path), "Test", {"k": 9}, ["x"], ones, timeout_s=10, poll_s=0.01)["x"].sum() == 3
    monkeypatch.undo()

    other = tmp_path / f"{description_hash({'k': 10})}-Test-x.tmp1-0a1b.npy"
    other.write_bytes(b"another user's")
    os.utime(other, (time.time() - 10_000,) * 2)
    real_remove = os.remove
    monkeypatch.setattr(os, "remove", lambda path: (_ for _ in ()).throw(PermissionError(errno.EPERM, "no", path))
                        if str(path) == str(other) else real_remove(path))
    assert cached_arrays(str(tmp_path), "Test", {"k": 10}, ["x"], ones, timeout_s=10)["x"].sum() == 3
    monkeypatch.undo()

    def broken_flock(fd, wait):
        raise OSError(errno.EIO, "I/O error")
    monkeypatch.setattr(cache, "_flock", broken_flock)
    with pytest.raises(OSError, match="I/O error"):
        cached_arrays(str(tmp_path), "Test", {"k": 11}, ["x"], ones, timeout_s=10)
    assert not (tmp_path / f"{description_hash({'k': 11})}.lock").exists()


def ctx_dead_pid():
    proc = mp.get_context("fork").Process(target=lambda: None)
    proc.start()
    proc.join()
    return proc.pid
