"""One training run at a time per --save folder.

Two runs saving into one folder (a job submitted twice, a second launch while the first still runs)
replace each other's checkpoints and remove each other's unfinished saves, and each reports success.
The first process of a run (rank 0) therefore holds an exclusive lock (flock) on SAVE/.run.lock from
before the --save checks until the run ends; a run that finds it held waits a few minutes (a job
restarted after a node failure can find the dead node's lock on a network filesystem until it lapses),
then stops with an error naming the holder (pid, host, start time), before anything is built. The
operating system drops the lock when its process dies, however it dies (forked children let go of
their copy). On a filesystem without flock (Lustre mounted without it) nothing is locked and the run
goes on, as before. Only rank 0 looks: the other ranks of a refused run end when their launcher ends
the job (torchrun; srun with --kill-on-bad-exit, as run_mi300x.sh uses), or at
--distributed-timeout-minutes.
"""
from __future__ import annotations

import errno
import os
import socket
import sys
import time

from megatron_zaya.checkpoint.format import CheckpointError

LOCK_FILE = ".run.lock"
_NO_LOCKS = (errno.ENOLCK, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)


class SaveFolderLock:
    """Held by rank 0 of a training run with --save (`hold`), released by `release` (idempotent)."""

    def __init__(self):
        self._fd: int | None = None

    @classmethod
    def hold(cls, save_dir: str | None, is_first_process: bool, create: bool = True) -> "SaveFolderLock":
        """The lock of `save_dir` for the first process of a run (nothing for the others or without
        --save); CheckpointError naming the holder when another run holds it. With create=False (a dry
        run) a folder that is not there is not made: no run can be using it."""
        lock = cls()
        if save_dir and is_first_process and (create or os.path.isdir(save_dir)):
            lock._acquire(save_dir)
        return lock

    @staticmethod
    def check_free(save_dir: str, what: str) -> None:
        """CheckpointError when a run holds the lock of `save_dir` (e.g. a training run whose first checkpoint
        is not complete yet), for a writer that does not take it (a conversion: a folder it made would keep
        the lock file). Nothing is created; a run that starts saving into the folder later is not seen."""
        import fcntl
        path = os.path.join(save_dir, LOCK_FILE)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:                  # no lock file (or not readable): no run has saved here
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            raise CheckpointError(f"{save_dir} is in use by a training run ({holder}; {path} is locked): {what} "
                                  f"into it would clash with its checkpoints; choose another output folder") from None
        except OSError:                  # no flock on this filesystem: nothing to tell
            pass
        finally:
            os.close(fd)

    def _acquire(self, save_dir: str) -> None:
        os.makedirs(save_dir, exist_ok=True)
        path = os.path.join(save_dir, LOCK_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            locked = _wait_for_lock(fd, path, save_dir)
        except BaseException:
            os.close(fd)
            raise
        if not locked:               # no flock on this filesystem: nothing to hold
            os.close(fd)
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                  .encode(), 0)
        self._fd = fd
        # A forked child (a DataLoader worker) shares the locked file: it closes its descriptor, so that a
        # worker outliving a killed rank 0 does not keep the folder locked.
        os.register_at_fork(after_in_child=self._close_in_child)

    def _close_in_child(self) -> None:
        if self._fd is not None:
            os.close(self._fd)         # the child's descriptor only; the parent keeps the lock
            self._fd = None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)         # closing the last descriptor drops the flock
            self._fd = None


def _wait_for_lock(fd: int, path: str, save_dir: str) -> bool:
    """flock `fd`, waiting up to MEGATRON_ZAYA_SAVE_LOCK_WAIT seconds (default 300) while another process holds
    it: a job restarted after a node failure may find the dead node's lock on a network filesystem until it
    lapses, within minutes. False when the filesystem has no flock; CheckpointError naming the holder when the
    wait runs out."""
    import fcntl

    patience = float(os.environ.get("MEGATRON_ZAYA_SAVE_LOCK_WAIT", "300"))
    deadline, said = time.time() + patience, False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
        except OSError as err:
            if err.errno in _NO_LOCKS:
                return False
            raise
        if time.time() >= deadline:
            raise CheckpointError(f"--save {save_dir} is in use by another training run ({holder}; {path} is "
                                  f"locked, waited {patience:.0f} s): two runs saving into one folder would "
                                  f"overwrite each other's checkpoints. Wait for it to end, or choose another --save")
        if not said:
            print(f"waiting up to {patience:.0f} s for {path} ({holder}) to be released", file=sys.stderr, flush=True)
            said = True
        time.sleep(min(5.0, max(0.0, deadline - time.time())))
