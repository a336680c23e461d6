"""Writing checkpoints: every rank its own files, in parallel; rank 0 finalizes (manifest, marker,
rename, latest_checkpointed_iteration.txt) once every rank's files are durable; old checkpoints are
pruned (--ckpt-keep: the newest N; Megatron-LM's --save-retain-interval: those at its multiples, the
others from the run's start on; with both, a checkpoint either rule keeps stays) without ever
touching the newest complete one or one newer than the save.
Non-persistent checkpoints (--non-persistent-save-interval; `"non_persistent": true` in their
metadata) are removed as soon as a newer checkpoint of either kind is complete, and do not count
towards --ckpt-keep; `promote` makes one persistent (a final or exit save at its iteration).
Pruning removes only the saver's own working folders (format.PARTIAL_RE, REPLACED_RE, DELETING_RE);
a same-iteration save interrupted between its two renames is restored by recover_replaced.

Synchronous saves agree on success with two tiny all-reduces. Asynchronous saves (--async-save)
block only for a copy of the state into reused host buffers; a background thread writes, and on
rank 0 also waits (polling the folder: no collective off the main thread) for every rank's
`rank_NNNNN.json` - or a `rank_NNNNN.failed` note - before it finalizes. At most one save is in
flight: the next one (and a clean exit) waits for it; the ranks agree on its outcome then (one
all-reduce), so a failed finalize on rank 0 is a failed save on every rank.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
import traceback

import torch

from megatron_zaya.checkpoint.format import (COMPLETE_MARKER, DELETING_RE, FORMAT_VERSION, LATEST_FILE, METADATA_FILE,
                                             PARTIAL_RE, REPLACED_RE, CheckpointError, Entry, atomic_write_bytes,
                                             atomic_write_json, file_crc32, fsync_dir, interrupted_publication,
                                             iter_dir_name, list_complete,
                                             list_replaced_complete, rank_stem, read_json, read_latest, write_latest,
                                             write_safetensors)


class CheckpointSaveError(RuntimeError):
    pass


def _default_log(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def publish_interrupted(save_dir: str, log=_default_log) -> int | None:
    """Point latest_checkpointed_iteration.txt at a complete checkpoint whose save was interrupted after
    its folder was published and before the file was updated (format.interrupted_publication, which a load
    follows anyway); returns its iteration. One process only (rank 0), at start-up."""
    iteration = interrupted_publication(save_dir)
    if iteration is not None:
        write_latest(save_dir, iteration)
        log(f"{os.path.join(save_dir, LATEST_FILE)} now names iteration {iteration}: its save completed, and "
            f"was interrupted before it updated the file")
    return iteration


def recover_replaced(save_dir: str, log=_default_log) -> list[int]:
    """Rename a complete `iter_N.replaced-<id>` back to iter_N where iter_N is missing (a save of an
    existing iteration crashed between its two renames: that folder is the only copy). Returns the
    iterations restored. One process only (rank 0): the renames are not safe to race."""
    restored = []
    for iteration, name in list_replaced_complete(save_dir).items():
        final = os.path.join(save_dir, iter_dir_name(iteration))
        if os.path.exists(final):
            continue
        os.replace(os.path.join(save_dir, name), final)
        fsync_dir(save_dir)
        log(f"restored checkpoint {final} from {name} (a save of the same iteration was interrupted)")
        restored.append(iteration)
    return restored


class CheckpointWriter:
    def __init__(self, save_dir: str, rank: int, world_size: int, run_id: str, keep: int | None = None,
                 log=_default_log, finalize_timeout: float | None = None, retain_interval: int | None = None):
        self.save_dir = os.path.abspath(save_dir)
        self.rank, self.world_size, self.run_id = rank, world_size, run_id
        if keep is not None and keep < 1:
            raise ValueError(f"--ckpt-keep={keep}: must be >= 1")
        if retain_interval is not None and retain_interval < 1:
            raise ValueError(f"--save-retain-interval={retain_interval}: must be >= 1")
        self.keep, self.retain_interval = keep, retain_interval
        # --save-retain-interval prunes only checkpoints from this iteration on (the one a run started
        # from, and its own): older ones, e.g. kept by hand, are left alone (as in Megatron-LM, which
        # removes only the checkpoint each save supersedes)
        self.retain_from = 0
        self.log = log
        self.finalize_timeout = finalize_timeout if finalize_timeout is not None else float(
            os.environ.get("MEGATRON_ZAYA_CKPT_FINALIZE_TIMEOUT", "1800"))
        self._buffers: dict[str, torch.Tensor] = {}
        self._thread: threading.Thread | None = None
        self._done = threading.Event()    # set when the save in flight has ended (its outcome in _pending)
        self._pending: tuple[int, bool] | None = None     # (iteration, succeeded) of the async save
        self.completed: list[tuple[int, bool]] = []        # (iteration, succeeded) of finished saves
        self.fault_hook = None                             # tests: called between this rank's writes
        self._non_persistent: dict[int, bool] = {}         # iteration -> saved as non-persistent (is_non_persistent)

    # -- folders ----------------------------------------------------------------------------------------
    def final_dir(self, iteration: int) -> str:
        return os.path.join(self.save_dir, iter_dir_name(iteration))

    def partial_dir(self, iteration: int) -> str:
        return os.path.join(self.save_dir, f"{iter_dir_name(iteration)}.partial-{self.run_id}")

    # -- one rank's files -----------------------------------------------------------------------------
    def write_rank(self, folder: str, iteration: int, entries: list[Entry], objects: dict) -> int:
        os.makedirs(folder, exist_ok=True)
        stem = os.path.join(folder, rank_stem(self.rank))
        tensors = {e.key: e.tensor for e in entries}
        info = write_safetensors(stem + ".safetensors", tensors, {"format": "pt", "rank": str(self.rank),
                                                                  "iteration": str(iteration)})
        if self.fault_hook is not None:
            self.fault_hook("after_tensors", stem)
        meta = {"format_version": FORMAT_VERSION, "rank": self.rank, "world_size": self.world_size,
                "iteration": iteration, "entries": {e.key: e.describe() for e in entries},
                "objects": objects, "file": info}
        atomic_write_json(stem + ".json", meta)      # its appearance means: this rank is done
        return info["bytes"]

    def _note_failure(self, folder: str, err: BaseException) -> None:
        try:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, rank_stem(self.rank) + ".failed"), "w") as f:
                f.write(f"{type(err).__name__}: {err}\n")
        except OSError:
            pass          # disk full: rank 0 then times out waiting; the previous checkpoint stays latest

    # -- rank 0: finalize ------------------------------------------------------------------------------
    def _wait_for_ranks(self, folder: str, timeout: float) -> str | None:
        """None when every rank's JSON is there; else the reason to give up. Polls the folder, less often
        as the wait goes on (50 ms, then up to 1 s): at a thousand ranks each look lists thousands of files
        on a shared file system's metadata server."""
        deadline, pause = time.monotonic() + timeout, 0.05
        while True:
            names = set(os.listdir(folder)) if os.path.isdir(folder) else set()
            failed = sorted(n for n in names if n.endswith(".failed"))
            if failed:
                notes = []
                for n in failed:
                    try:
                        notes.append(f"{n[:-7]}: {open(os.path.join(folder, n)).read().strip()}")
                    except OSError:
                        notes.append(n[:-7])
                return "; ".join(notes)
            missing = [r for r in range(self.world_size) if rank_stem(r) + ".json" not in names]
            if not missing:
                return None
            if time.monotonic() > deadline:
                return f"ranks {missing[:8]} did not finish writing within {timeout:.0f} s"
            time.sleep(pause)
            pause = min(1.0, pause * 1.5)

    def finalize(self, folder: str, iteration: int, global_meta: dict, timeout: float) -> None:
        problem = self._wait_for_ranks(folder, timeout)
        if problem:
            raise CheckpointSaveError(problem)
        files = {}
        for r in range(self.world_size):
            for ext in (".json", ".safetensors"):
                name = rank_stem(r) + ext
                path = os.path.join(folder, name)
                if ext == ".json":
                    crc, size = file_crc32(path)
                    files[name] = {"bytes": size, "crc32": crc}
                else:
                    import json
                    with open(os.path.join(folder, rank_stem(r) + ".json")) as f:
                        info = json.load(f)["file"]
                    files[name] = {"bytes": info["bytes"], "crc32": info["crc32"]}
                    if os.path.getsize(path) != info["bytes"]:
                        raise CheckpointSaveError(f"{path}: size {os.path.getsize(path)} != {info['bytes']} written")
        meta = dict(global_meta, format_version=FORMAT_VERSION, iteration=iteration, files=files,
                    saved_at=time.strftime("%Y-%m-%d %H:%M:%S"), run_id=self.run_id)
        atomic_write_json(os.path.join(folder, METADATA_FILE), meta)
        self._non_persistent[iteration] = bool(meta.get("non_persistent"))
        if self.fault_hook is not None:
            self.fault_hook("before_marker", folder)
        atomic_write_bytes(os.path.join(folder, COMPLETE_MARKER), f"{iteration}\n".encode())
        final = self.final_dir(iteration)
        replaced = None
        if os.path.exists(final):      # the same iteration saved again: keep the old one until the swap
            replaced = f"{final}.replaced-{self.run_id}"
            os.replace(final, replaced)
        try:
            os.replace(folder, final)
        except BaseException:
            if replaced:               # (a crash right here is undone by recover_replaced at the next start)
                os.replace(replaced, final)
            raise
        fsync_dir(self.save_dir)
        try:
            published = write_latest(self.save_dir, iteration)
        except BaseException:
            # Not published: undo the rename, so the failed save leaves no complete folder newer than
            # the latest (pruning counts complete folders) and a replaced one comes back.
            os.replace(final, folder)      # its partial name first: a crash here leaves debris, never an iter_N
            with contextlib.suppress(OSError):      # folder without its marker that nothing would ever remove
                os.unlink(os.path.join(folder, COMPLETE_MARKER))
            if replaced:
                os.replace(replaced, final)
            fsync_dir(self.save_dir)
            raise
        if replaced:
            shutil.rmtree(replaced, ignore_errors=True)
        if not published:
            self.log(f"warning: {final} saved, but latest_checkpointed_iteration.txt keeps naming the later complete "
                     f"checkpoint iteration {read_latest(self.save_dir)} (it never moves backwards)")
        self.prune(iteration)

    def _is_debris(self, name: str, just_saved: int) -> bool:
        """Whether `name` in the save folder is a working folder of the saver that is no longer needed:
        a partial folder of a dead (or this, finished) save, a half-deleted pruned checkpoint, or a
        replaced predecessor whose iteration is complete again. Only the saver's exact names match."""
        m = PARTIAL_RE.match(name)
        if m:
            return m.group(2) != self.run_id or int(m.group(1)) <= just_saved
        if DELETING_RE.match(name):
            return True
        m = REPLACED_RE.match(name)
        return bool(m) and os.path.isfile(os.path.join(self.final_dir(int(m.group(1))), COMPLETE_MARKER))

    def is_non_persistent(self, iteration: int) -> bool:
        """Whether the complete checkpoint of `iteration` was saved as non-persistent (an unreadable
        metadata file counts as persistent: it is never removed for being superseded). Read once per
        iteration and remembered (a run with many checkpoints does not re-read their metadata each save)."""
        if iteration not in self._non_persistent:
            try:
                meta = read_json(os.path.join(self.final_dir(iteration), METADATA_FILE))
                self._non_persistent[iteration] = bool(meta.get("non_persistent"))
            except (OSError, ValueError, CheckpointError):
                return False
        return self._non_persistent[iteration]

    def promote(self, iteration: int) -> None:
        """Make the non-persistent checkpoint of `iteration` a persistent one (its metadata rewritten
        atomically)."""
        path = os.path.join(self.final_dir(iteration), METADATA_FILE)
        meta = read_json(path)
        meta["non_persistent"] = False
        atomic_write_json(path, meta)
        self._non_persistent[iteration] = False

    def prune(self, just_saved: int) -> None:
        """Keep the newest --ckpt-keep complete persistent checkpoints (and with --save-retain-interval
        those at its multiples, and the newest) and no non-persistent one older than `just_saved`,
        never touching one newer than `just_saved`; drop the saver's own debris (see _is_debris),
        after restoring an interrupted replacement."""
        recover_replaced(self.save_dir, self.log)
        for name in os.listdir(self.save_dir):
            if self._is_debris(name, just_saved):
                shutil.rmtree(os.path.join(self.save_dir, name), ignore_errors=True)
        non_persistent = {it: self.is_non_persistent(it) for it in list_complete(self.save_dir)}
        superseded = [it for it, flag in non_persistent.items() if flag and it < just_saved]
        persistent = [it for it, flag in non_persistent.items() if not flag]
        doomed = [(it, "superseded non-persistent checkpoint") for it in superseded]
        doomed += [(it, why) for it in persistent if it < just_saved and (why := self.prune_reason(it, persistent))]
        for it, why in sorted(doomed):
            path = self.final_dir(it)
            try:
                # Renamed first (atomic, as the publication's rename): no longer a checkpoint from this moment,
                # and a crash before the removal ends leaves a .deleting- folder, which the next prune removes.
                # (Unlinking its COMPLETE first left, after a crash between the two, a checkpoint-sized iter_N
                # folder that no prune would remove.)
                gone = f"{path}.deleting-{self.run_id}"
                os.replace(path, gone)
                fsync_dir(self.save_dir)
                shutil.rmtree(gone, ignore_errors=True)
                self.log(f"removed old checkpoint {path} ({why})")
            except OSError as err:
                self.log(f"warning: could not remove old checkpoint {path}: {err}")

    def prune_reason(self, iteration: int, persistent: list[int]) -> str | None:
        """Why the persistent checkpoint of `iteration` goes (None: it stays). `persistent`: every
        complete persistent iteration, ascending; the newest always stays, and so does one at a
        multiple of --save-retain-interval."""
        if iteration == persistent[-1]:
            return None
        if self.retain_interval and iteration % self.retain_interval == 0:
            return None
        if self.keep:
            return None if iteration in persistent[-self.keep:] else f"--ckpt-keep {self.keep}"
        if self.retain_interval and iteration >= self.retain_from:
            return f"--save-retain-interval {self.retain_interval}"
        return None

    def _cleanup(self, folder: str) -> None:
        shutil.rmtree(folder, ignore_errors=True)

    # -- synchronous ------------------------------------------------------------------------------------
    def save_sync(self, iteration: int, entries: list[Entry], objects: dict, global_meta: dict, agree) -> bool:
        """agree(flag: bool) -> bool: True when flag is True on EVERY rank (collective)."""
        self.wait(agree=agree)
        folder = self.partial_dir(iteration)
        ok = True
        try:
            self.write_rank(folder, iteration, entries, objects)
        except Exception as err:
            ok = False
            self.log(f"[rank {self.rank}] error: writing checkpoint iteration {iteration} to {folder} failed: "
                     f"{type(err).__name__}: {err}")
            self._note_failure(folder, err)
        all_ok = agree(ok)
        done = False
        if self.rank == 0:
            if all_ok:
                try:
                    self.finalize(folder, iteration, global_meta, timeout=min(300.0, self.finalize_timeout))
                    done = True
                except Exception as err:
                    self.log(f"error: finalizing checkpoint iteration {iteration} failed: {type(err).__name__}: {err}")
            if not done:
                self._cleanup(folder)
        done = not agree(not done) if self.rank == 0 else not agree(True)
        self.completed.append((iteration, done))
        return done

    # -- asynchronous -----------------------------------------------------------------------------------
    def snapshot(self, entries: list[Entry]) -> list[Entry]:
        """Copies of the entries' tensors in host buffers reused from save to save (pinned for GPUs)."""
        out, cuda = [], False
        threads = torch.get_num_threads()
        torch.set_num_threads(1)     # memory-bound copies: one thread is as fast and immune to oversubscription
        try:
            for e in entries:
                out.append(self._copy(e))
                cuda = cuda or e.tensor.is_cuda
        finally:
            torch.set_num_threads(threads)
        if cuda:
            torch.cuda.synchronize()
        live = {e.key for e in entries}
        for key in [k for k in self._buffers if k not in live]:
            del self._buffers[key]
        return out

    def _copy(self, e: Entry) -> Entry:
        t = e.tensor.detach()
        buf = self._buffers.get(e.key)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=t.is_cuda)
            self._buffers[e.key] = buf
        buf.copy_(t, non_blocking=t.is_cuda)
        return Entry(e.key, buf, e.shape, e.ranges, e.flat, e.local)

    def save_async(self, iteration: int, entries: list[Entry], objects: dict, global_meta: dict,
                   agree=None) -> None:
        self.wait(agree=agree)
        copies = self.snapshot(entries)
        self._pending = (iteration, False)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._background, args=(iteration, copies, objects, global_meta),
                                        name=f"checkpoint-save-{iteration}", daemon=True)
        self._thread.start()

    def _background(self, iteration, entries, objects, global_meta) -> None:
        folder = self.partial_dir(iteration)
        try:
            self.write_rank(folder, iteration, entries, objects)
            if self.rank == 0:
                self.finalize(folder, iteration, global_meta, timeout=self.finalize_timeout)
            self._pending = (iteration, True)
        except Exception as err:
            self.log(f"[rank {self.rank}] error: asynchronous checkpoint iteration {iteration} failed: "
                     f"{type(err).__name__}: {err}\n{traceback.format_exc()}")
            self._note_failure(folder, err)
            if self.rank == 0:
                self._cleanup(folder)
        finally:
            self._done.set()

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and not self._done.is_set()

    def wait(self, timeout: float | None = None, agree=None) -> tuple[int, bool] | None:
        """Wait for the save in flight; returns its (iteration, succeeded) or None if there was none
        (or it is still running after `timeout` seconds: it is then abandoned, never half-published).

        Only rank 0 knows whether the finalize (manifest, marker, rename, latest) succeeded: with
        `agree` (collective, see save_sync; every rank must call wait at the same point) every rank
        records the same outcome. Without it (close() on an error path) the outcome is this rank's."""
        if self._thread is None:
            return None
        # An event, not Thread.join: a KeyboardInterrupt (a second Ctrl-C) in join marks the thread as ended
        # while it still writes (CPython 3.11), and a later wait (close) then abandoned a good save.
        if not self._done.wait(timeout):
            self.log(f"[rank {self.rank}] warning: the background checkpoint save did not finish within {timeout:.0f} s; "
                     f"abandoning it (the previous checkpoint stays the latest)")
            return None
        self._thread = None
        result, self._pending = self._pending, None
        if agree is not None:
            result = (result[0], agree(result[1]))
        self.completed.append(result)
        return result
