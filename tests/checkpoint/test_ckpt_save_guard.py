"""Nothing in a --save folder is lost: a run that does not continue from the folder's latest
checkpoint is refused before anything is built; latest_checkpointed_iteration.txt never moves
backwards; pruning touches only the saver's own folders; an interrupted same-iteration save is
restored, not deleted."""
import errno
import os
import time

import pytest
import torch

from ckpt_harness import flags, train
from megatron_zaya.checkpoint import CheckpointError, saver
from megatron_zaya.checkpoint.format import (COMPLETE_MARKER, LATEST_FILE, Entry, list_complete, read_latest,
                                             write_latest)
from megatron_zaya.checkpoint.preflight import check_save_folder
from megatron_zaya.checkpoint.save_lock import LOCK_FILE

RUN_ID = "0123456789"


def fake_checkpoint(save, iteration, name=None, complete=True):
    """A folder the checks take for a (complete) checkpoint: the marker is all they look at."""
    folder = os.path.join(save, name or f"iter_{iteration:07d}")
    os.makedirs(folder)
    if complete:
        open(os.path.join(folder, COMPLETE_MARKER), "w").write(f"{iteration}\n")
    return folder


def snapshot(save):
    """Every file under `save` with its size and modification time (but the run lock's record of its holder)."""
    out = {}
    for dirpath, _, names in os.walk(save):
        for n in names:
            if n == LOCK_FILE:
                continue
            path = os.path.join(dirpath, n)
            out[os.path.relpath(path, save)] = (os.path.getsize(path), os.stat(path).st_mtime_ns)
    return out


def no_build(*args, **kwargs):
    raise AssertionError("the run got as far as building its runtime and model")


def test_run_not_continuing_a_populated_save_folder_is_refused_before_any_build(ckpt_corpus, ckpt_cache, tmp_path,
                                                                                  monkeypatch):
    """The audit's case: a fresh run (or --finetune, or an older iteration of the folder, or another
    --load) saving into a folder with checkpoints would overwrite iteration 1, prune 2 and 3 and move
    latest from 4 to 1. It is refused, naming --save and the latest iteration, and nothing changes."""
    save = str(tmp_path / "B")
    train(flags(ckpt_corpus, 4, "--save", save, "--save-interval", "1", cache=ckpt_cache))
    before = snapshot(save)
    monkeypatch.setattr("megatron_zaya.training.setup.build_runtime", no_build)
    for load in ([], ["--load", save, "--finetune"], ["--load", os.path.join(save, "iter_0000002")],
                 ["--load", str(tmp_path / "elsewhere")]):
        with pytest.raises(CheckpointError, match=rf"--save {save} already holds checkpoints \(latest iteration 4\)"
                                                  rf".*pass --load {save}"):
            train(flags(ckpt_corpus, 1, "--save", save, "--ckpt-keep", "1", "--seed", "9", *load, cache=ckpt_cache))
    assert snapshot(save) == before and read_latest(save) == 4
    monkeypatch.undo()
    resumed = train(flags(ckpt_corpus, 5, "--save", save, "--load", save, "--ckpt-keep", "1", cache=ckpt_cache))
    assert resumed.trainer.checkpointer.loaded["iteration"] == 4 and sorted(resumed.losses) == [5]
    assert list_complete(save) == [5] and read_latest(save) == 5


def test_save_folder_check_accepts_the_normal_cases(tmp_path):
    save, other = str(tmp_path / "X"), str(tmp_path / "Y")
    check_save_folder(None, None, False)                       # no --save
    check_save_folder(save, None, False)                       # a new folder
    os.makedirs(save)
    fake_checkpoint(save, 3, name=f"iter_0000003.partial-{RUN_ID}", complete=False)
    check_save_folder(save, other, False)                      # --load Y --save X, X without checkpoints
    check_save_folder(save, save, True)                        # --finetune into a folder without checkpoints
    fake_checkpoint(save, 2)
    fake_checkpoint(save, 4)
    check_save_folder(save, save, False)                       # --load X --save X: the resume
    check_save_folder(save, save + os.sep, False)
    check_save_folder(save, os.path.join(save, "iter_0000004"), False)   # its newest checkpoint, by name
    os.symlink(os.path.join(save, "iter_0000004"), tmp_path / "newest")
    check_save_folder(save, str(tmp_path / "newest"), False)            # or through a link to it
    os.rename(os.path.join(save, "iter_0000004"), tmp_path / "archived")  # or it is a link to storage elsewhere
    os.symlink(tmp_path / "archived", os.path.join(save, "iter_0000004"))
    check_save_folder(save, os.path.join(save, "iter_0000004"), False)
    check_save_folder(save, str(tmp_path / "newest"), False)            # (a link to that link)
    for name, target in (("slash", os.path.join(save, "iter_0000004") + os.sep),    # as tab completion writes it
                         ("dot", os.path.join(save, "iter_0000004", ".")), ("up", os.path.join(save, "lnk2", ".."))):
        os.symlink(target, tmp_path / name)
    os.symlink(os.path.join(save, "iter_0000004"), os.path.join(save, "lnk2"))  # (lnk2/.. is where lnk2 leads, up)
    check_save_folder(save, str(tmp_path / "slash"), False)
    check_save_folder(save, str(tmp_path / "dot"), False)
    check_save_folder(save, os.path.join(save, "iter_0000004", "."), False)
    with pytest.raises(CheckpointError, match="another folder"):   # tmp_path: archived/.. holds no checkpoint
        check_save_folder(save, str(tmp_path / "up"), False)
    os.makedirs(tmp_path / "archived" / "mp_rank_00")     # rank0/.. is where rank0 leads, up: the newest checkpoint
    os.symlink(os.path.join(save, "iter_0000004", "mp_rank_00"), tmp_path / "rank0")
    check_save_folder(save, os.path.join(tmp_path, "rank0", ".."), False)
    check_save_folder(save, save, False)
    os.makedirs(tmp_path / "elsewhere" / "sub")            # SAVE/lnk/../iter_0000004 is elsewhere/iter_0000004
    fake_checkpoint(str(tmp_path / "elsewhere"), 4)
    os.symlink(tmp_path / "elsewhere" / "sub", os.path.join(save, "lnk"))
    with pytest.raises(CheckpointError, match="another folder"):
        check_save_folder(save, os.path.join(save, "lnk", "..", "iter_0000004"), False)
    with pytest.raises(CheckpointError, match="iteration 2, older than the latest"):
        check_save_folder(save, os.path.join(save, "iter_0000002"), False)
    with pytest.raises(CheckpointError, match="another folder"):
        check_save_folder(save, other, False)


def test_a_checkpoint_left_only_as_an_interrupted_replacement_counts(tmp_path):
    save = str(tmp_path / "X")
    os.makedirs(save)
    fake_checkpoint(save, 5, name=f"iter_0000005.replaced-{RUN_ID}")
    with pytest.raises(CheckpointError, match="latest iteration 5"):
        check_save_folder(save, None, False)


def _name_latest(save, iteration, before_or_after_iteration):
    """Write latest_checkpointed_iteration.txt = iteration, dated 10 s before or after the newest complete
    checkpoint's marker."""
    path = os.path.join(save, LATEST_FILE)
    open(path, "w").write(f"{iteration}\n")
    marker = os.stat(os.path.join(save, f"iter_{max(list_complete(save)):07d}", COMPLETE_MARKER)).st_mtime
    shift = -10 if before_or_after_iteration == "before" else 10
    os.utime(path, (marker + shift, marker + shift))


def test_a_save_interrupted_before_it_named_itself_latest_is_the_latest(ckpt_corpus, ckpt_cache, tmp_path):
    """A crash (SIGKILL) between publishing iter_8 and updating the latest file, which still names 4 and is
    older than iter_8: a resume loads 8, the file is brought forward, nothing is trained twice (the resume
    loaded 4, retrained 5-8 and replaced the complete iter_8). The same state with the file written after
    iter_8 is an edit going back to 4: refused, since the run would overwrite iter_8; nothing changes."""
    from megatron_zaya.checkpoint.format import checkpoint_candidates, interrupted_publication
    from megatron_zaya.checkpoint.inspection import resolve_folder

    save = str(tmp_path / "S")
    train(flags(ckpt_corpus, 8, "--save", save, "--save-interval", "4", cache=ckpt_cache))
    assert list_complete(save) == [4, 8]
    _name_latest(save, 4, "after")                  # edited to go back: the newer checkpoint is not taken
    assert interrupted_publication(save) is None and checkpoint_candidates(save)[0].endswith("iter_0000004")
    assert resolve_folder(save).endswith("iter_0000004")      # the tools (export, generate) take the same one
    before = snapshot(save)
    with pytest.raises(CheckpointError, match="names iteration 4, so --load .* starts there, but the complete "
                                              "iteration 8 is newer"):
        train(flags(ckpt_corpus, 12, "--save", save, "--load", save, "--save-interval", "4", cache=ckpt_cache))
    assert snapshot(save) == before
    _name_latest(save, 4, "before")                 # the crash window
    assert interrupted_publication(save) == 8 and checkpoint_candidates(save)[0].endswith("iter_0000008")
    assert resolve_folder(save).endswith("iter_0000008")      # (they took 4, which the file names)
    resumed = train(flags(ckpt_corpus, 12, "--save", save, "--load", save, "--save-interval", "4",
                          cache=ckpt_cache))
    assert resumed.trainer.checkpointer.loaded["iteration"] == 8 and sorted(resumed.losses) == [9, 10, 11, 12]
    assert read_latest(save) == 12 and list_complete(save) == [4, 8, 12]


def test_a_save_folder_another_run_is_using_is_refused_before_any_build(ckpt_corpus, ckpt_cache, tmp_path,
                                                                       monkeypatch):
    """Two runs saving into one folder replaced each other's checkpoints and deleted each other's unfinished
    saves, both exiting 0. The first process of a run holds SAVE/.run.lock while it runs: a second run stops
    with an error naming the holder, before it builds anything; once the first ends, the folder is free."""
    from megatron_zaya.checkpoint.save_lock import SaveFolderLock

    save = str(tmp_path / "S")
    other_run = SaveFolderLock.hold(save, is_first_process=True)
    monkeypatch.setenv("MEGATRON_ZAYA_SAVE_LOCK_WAIT", "0")
    monkeypatch.setattr("megatron_zaya.training.setup.build_runtime", no_build)
    with pytest.raises(CheckpointError, match=rf"--save {save} is in use by another training run \(pid {os.getpid()} "):
        train(flags(ckpt_corpus, 2, "--save", save, cache=ckpt_cache))
    assert os.listdir(save) == [LOCK_FILE]
    other_run.release()
    monkeypatch.undo()
    train(flags(ckpt_corpus, 2, "--save", save, cache=ckpt_cache))
    assert list_complete(save) == [2]
    SaveFolderLock.hold(save, is_first_process=True).release()     # the finished run let go of it


def test_a_lock_let_go_within_the_wait_is_taken(tmp_path, monkeypatch, capsys):
    """A restart after a node failure can find the dead node's lock until the filesystem lets it lapse: the
    run waits (MEGATRON_ZAYA_SAVE_LOCK_WAIT seconds) and takes the lock once it is free."""
    import threading
    from megatron_zaya.checkpoint.save_lock import SaveFolderLock

    held = SaveFolderLock.hold(str(tmp_path), is_first_process=True)
    threading.Timer(1.0, held.release).start()
    monkeypatch.setenv("MEGATRON_ZAYA_SAVE_LOCK_WAIT", "60")
    SaveFolderLock.hold(str(tmp_path), is_first_process=True).release()
    assert "waiting up to 60 s for" in capsys.readouterr().err


def test_a_forked_child_does_not_keep_the_save_folder_locked(tmp_path, monkeypatch):
    """A DataLoader worker is a fork of rank 0 and shared its locked file: a worker outliving a killed rank 0
    kept the folder locked. Children close their copy; the parent's release frees the folder."""
    from megatron_zaya.checkpoint.save_lock import SaveFolderLock

    lock = SaveFolderLock.hold(str(tmp_path), is_first_process=True)
    monkeypatch.setenv("MEGATRON_ZAYA_SAVE_LOCK_WAIT", "0")
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the "worker": alive past the parent's release
        os.write(ready_w, b"1")
        time.sleep(3)
        os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"1"
        with pytest.raises(CheckpointError, match="in use by another training run"):
            SaveFolderLock.hold(str(tmp_path), is_first_process=True)     # the parent still holds it
        lock.release()
        SaveFolderLock.hold(str(tmp_path), is_first_process=True).release()   # free while the child lives
    finally:
        os.waitpid(pid, 0)


def test_latest_never_moves_backwards_past_a_complete_checkpoint(tmp_path):
    save = str(tmp_path)
    fake_checkpoint(save, 4)
    assert write_latest(save, 4) and read_latest(save) == 4
    assert not write_latest(save, 1) and read_latest(save) == 4
    assert write_latest(save, 6) and read_latest(save) == 6       # forwards, even to a folder not there yet
    os.unlink(os.path.join(save, LATEST_FILE))
    open(os.path.join(save, LATEST_FILE), "w").write("9\n")        # names a folder that is not complete
    assert write_latest(save, 4) and read_latest(save) == 4


def test_prune_touches_only_the_savers_own_folders_and_nothing_newer(tmp_path):
    save = str(tmp_path)
    user = ["photos.replaced-2023", "notes.deleting-x", "iter_0000001.partial-old", "my_iter_0000001.partial-" + RUN_ID,
            "iter_0000001.replaced-2023", "iter_0000001.deleting-abc"]
    for name in user:
        os.makedirs(os.path.join(save, name))
    debris = [f"iter_0000001.partial-{'a' * 10}", f"iter_0000002.deleting-{'b' * 10}",
              f"iter_0000001.replaced-{'c' * 10}"]
    for name in debris:
        os.makedirs(os.path.join(save, name))
    for it in (1, 2, 3):
        fake_checkpoint(save, it)
    writer = saver.CheckpointWriter(save, 0, 1, RUN_ID, keep=1, log=lambda msg: None)
    writer.prune(just_saved=1)        # a checkpoint older than others: they are never pruned for it
    left = set(os.listdir(save))
    assert set(user) <= left and not set(debris) & left
    assert list_complete(save) == [1, 2, 3]
    writer.prune(just_saved=3)
    assert list_complete(save) == [3] and set(user) <= set(os.listdir(save))


def test_a_prune_killed_midway_leaves_a_complete_checkpoint_or_debris_never_a_markerless_one(tmp_path, monkeypatch):
    """Killed while removing an old checkpoint (at the rename, or in the removal): iteration 1 is either still
    complete or a .deleting- folder, which the next prune removes; never an iter_0000001 without its COMPLETE
    marker, which no prune would ever remove (a checkpoint-sized leak)."""
    save = str(tmp_path)
    for it in (1, 2):
        fake_checkpoint(save, it)
    writer = saver.CheckpointWriter(save, 0, 1, RUN_ID, keep=1, log=lambda msg: None)
    real_replace, real_rmtree = os.replace, saver.shutil.rmtree

    def killed(*args, **kwargs):
        raise KeyboardInterrupt          # stands for SIGKILL: nothing after it runs
    monkeypatch.setattr(saver.os, "replace", lambda src, dst: killed() if ".deleting-" in dst else real_replace(src, dst))
    with pytest.raises(KeyboardInterrupt):
        writer.prune(just_saved=2)
    assert list_complete(save) == [1, 2] and sorted(os.listdir(save)) == ["iter_0000001", "iter_0000002"]
    monkeypatch.setattr(saver.os, "replace", real_replace)
    monkeypatch.setattr(saver.shutil, "rmtree", lambda path, **kw: killed() if ".deleting-" in path else
                        real_rmtree(path, **kw))
    with pytest.raises(KeyboardInterrupt):
        writer.prune(just_saved=2)
    assert list_complete(save) == [2] and sorted(os.listdir(save)) == [f"iter_0000001.deleting-{RUN_ID}",
                                                                      "iter_0000002"]
    monkeypatch.setattr(saver.shutil, "rmtree", real_rmtree)
    writer.prune(just_saved=2)
    assert sorted(os.listdir(save)) == ["iter_0000002"]


def _save(writer, iteration, value):
    entry = Entry("model/w", torch.full((4,), float(value)), [4], [[[0, 4]]])
    folder = writer.partial_dir(iteration)
    writer.write_rank(folder, iteration, [entry], {})
    writer.finalize(folder, iteration, {"value": value}, timeout=10)


def _value(save, iteration):
    import json
    return json.load(open(os.path.join(save, f"iter_{iteration:07d}", "metadata.json")))["value"]


def test_replacing_an_iteration_that_fails_or_is_interrupted_keeps_the_old_copy(tmp_path, monkeypatch):
    """A failure of the rename into place puts the replaced folder back; a crash between the two
    renames (only the `.replaced-` folder is left) is repaired by the next prune, not deleted."""
    save = str(tmp_path)
    first = saver.CheckpointWriter(save, 0, 1, "a" * 10, log=lambda msg: None)
    _save(first, 1, 1)
    second = saver.CheckpointWriter(save, 0, 1, "b" * 10, log=lambda msg: None)
    real_replace = os.replace

    def failing_replace(src, dst):
        if ".partial-" in os.path.basename(src):
            raise OSError(errno.EIO, "Input/output error", src)
        return real_replace(src, dst)
    monkeypatch.setattr(saver.os, "replace", failing_replace)
    with pytest.raises(OSError):
        _save(second, 1, 2)
    monkeypatch.undo()
    assert list_complete(save) == [1] and _value(save, 1) == 1

    os.rename(os.path.join(save, "iter_0000001"), os.path.join(save, f"iter_0000001.replaced-{'b' * 10}"))
    _save(second, 2, 2)                 # its prune restores iteration 1 instead of deleting its only copy
    assert list_complete(save) == [1, 2] and _value(save, 1) == 1
    assert sorted(os.listdir(save)) == ["iter_0000001", "iter_0000002", LATEST_FILE]


def test_a_save_older_than_the_latest_complete_checkpoint_leaves_latest_and_warns(tmp_path):
    """saver.CheckpointWriter.finalize: saving iteration 2 into a folder whose latest_checkpointed_iteration.txt
    names the complete iteration 4 publishes iter_0000002 but leaves the file naming 4 (format.write_latest: it
    never moves backwards past a complete checkpoint), logs that warning, and prunes nothing newer."""
    save, logged = str(tmp_path), []
    writer = saver.CheckpointWriter(save, 0, 1, RUN_ID, keep=1, log=logged.append)
    _save(writer, 4, 4)
    assert read_latest(save) == 4 and not any("warning" in m for m in logged)
    _save(writer, 2, 2)
    assert read_latest(save) == 4 and list_complete(save) == [2, 4] and _value(save, 2) == 2
    assert [m for m in logged if "warning" in m] == [
        f"warning: {os.path.join(save, 'iter_0000002')} saved, but latest_checkpointed_iteration.txt keeps naming "
        "the later complete checkpoint iteration 4 (it never moves backwards)"]
    _save(writer, 6, 6)                     # forwards again: published, and --ckpt-keep 1 prunes 2 and 4
    assert read_latest(save) == 6 and list_complete(save) == [6]


def test_interrupted_replacement_is_restored_at_start_up_and_resumed(ckpt_corpus, ckpt_cache, tmp_path):
    save = str(tmp_path / "crashed")
    train(flags(ckpt_corpus, 2, "--save", save, cache=ckpt_cache))
    os.rename(os.path.join(save, "iter_0000002"), os.path.join(save, f"iter_0000002.replaced-{RUN_ID}"))
    resumed = train(flags(ckpt_corpus, 3, "--save", save, "--load", save, cache=ckpt_cache))
    assert resumed.trainer.checkpointer.loaded["iteration"] == 2 and sorted(resumed.losses) == [3]
    assert sorted(os.listdir(save)) == [LOCK_FILE, "iter_0000002", "iter_0000003", LATEST_FILE]


def test_load_falls_back_to_the_next_newest_and_counts_only_marked_folders(tmp_path):
    """--load's candidates: the latest, then the other complete checkpoints newest first (a damaged latest
    costs one interval, not the run); a folder without COMPLETE is no checkpoint, for --load, pruning and
    the tools (resolve_folder: the newest complete one when latest_checkpointed_iteration.txt is missing).
    Reference: the iterations written here, ordered by hand."""
    from megatron_zaya.checkpoint.format import checkpoint_candidates
    from megatron_zaya.checkpoint.inspection import resolve_folder
    save = str(tmp_path)
    for iteration in (1, 2, 3):
        fake_checkpoint(save, iteration)
    fake_checkpoint(save, 4, complete=False)               # a folder whose save never completed
    assert list_complete(save) == [1, 2, 3]
    assert resolve_folder(save) == os.path.join(save, "iter_0000003")        # no latest file: the newest
    open(os.path.join(save, LATEST_FILE), "w").write("3\n")
    assert checkpoint_candidates(save) == [os.path.join(save, f"iter_{it:07d}") for it in (3, 2, 1)]


def test_the_tools_take_the_checkpoint_a_load_resumes_from(tmp_path, capsys):
    """resolve_folder (export, generate, evaluate, inspect) as --load: the copy a same-iteration save that was
    interrupted left (iter_N.replaced-*, which --load renames back; the tools said "no such checkpoint folder"),
    and past a latest that is missing or incomplete, the newest complete one with a warning (they stopped)."""
    from megatron_zaya.checkpoint.inspection import resolve_folder
    save = str(tmp_path)
    fake_checkpoint(save, 2)
    replaced = fake_checkpoint(save, 4, name="iter_0000004.replaced-0123456789")
    open(os.path.join(save, LATEST_FILE), "w").write("4\n")
    assert resolve_folder(save) == replaced and capsys.readouterr().err == ""
    os.rename(replaced, replaced + "-gone")                                   # (no longer a copy of iteration 4)
    assert resolve_folder(save) == os.path.join(save, "iter_0000002")
    assert "the latest checkpoint, iter_0000004, is missing: using iter_0000002, as --load would" in \
        capsys.readouterr().err
    fake_checkpoint(save, 4, complete=False)
    assert resolve_folder(save) == os.path.join(save, "iter_0000002")
    assert "iter_0000004, is incomplete" in capsys.readouterr().err


def test_a_small_file_is_durable_before_it_replaces_the_old_one(tmp_path, monkeypatch):
    """atomic_write_bytes (COMPLETE, metadata.json, latest_checkpointed_iteration.txt): the new bytes are
    fsynced before the rename publishes them (a crash after the rename must not leave an empty file), then
    the folder. Reference: the order of the system calls, recorded."""
    from megatron_zaya.checkpoint import format as fmt
    calls, real_fsync, real_replace = [], os.fsync, os.replace
    monkeypatch.setattr(fmt.os, "fsync", lambda fd: calls.append("fsync") or real_fsync(fd))
    monkeypatch.setattr(fmt.os, "replace", lambda a, b: calls.append("replace") or real_replace(a, b))
    fmt.atomic_write_bytes(str(tmp_path / "COMPLETE"), b"7\n")
    assert calls == ["fsync", "replace", "fsync"] and (tmp_path / "COMPLETE").read_bytes() == b"7\n"


def test_saving_an_iteration_again_replaces_it_and_a_failed_publication_brings_the_old_back(tmp_path, monkeypatch):
    """The same iteration saved again (a run resumed from iteration 1 that saves at 1): the new copy takes
    its place, the `.replaced-` folder of the old one is removed, and the latest file names it. When writing
    the latest file fails after the swap, the old copy comes back and the new one is left unpublished."""
    save = str(tmp_path)
    first = saver.CheckpointWriter(save, 0, 1, "a" * 10, log=lambda msg: None)
    _save(first, 1, 1)
    second = saver.CheckpointWriter(save, 0, 1, "b" * 10, log=lambda msg: None)
    _save(second, 1, 2)
    assert list_complete(save) == [1] and _value(save, 1) == 2 and read_latest(save) == 1
    assert sorted(os.listdir(save)) == ["iter_0000001", LATEST_FILE]

    def failing_write_latest(save_dir, iteration):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(saver, "write_latest", failing_write_latest)
    third = saver.CheckpointWriter(save, 0, 1, "c" * 10, log=lambda msg: None)
    with pytest.raises(OSError, match="No space left"):
        _save(third, 1, 3)
    monkeypatch.undo()
    assert list_complete(save) == [1] and _value(save, 1) == 2 and read_latest(save) == 1
    assert not any(".replaced-" in name for name in os.listdir(save))
    assert not any(os.path.exists(os.path.join(save, name, COMPLETE_MARKER))
                   for name in os.listdir(save) if ".partial-" in name)
