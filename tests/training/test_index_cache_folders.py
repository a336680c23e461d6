"""The index cache's folders (megatron_zaya.paths.check_index_cache_dirs) are checked before any model is built or
loaded, by pretrain_zaya.py and tools/evaluate.py alike: --data-cache-path, or without it the default folder beside
EVERY data folder of the blend (each dataset's indices go beside it; only the first one's was checked), an existing
one included (it was skipped: one that cannot be written is a warning, and an index missing there is built in
memory). evaluate.py checked none and failed with a traceback after loading the model.

A read-only folder cannot be made for root (who ignores permissions): `read_only` makes creating a folder in the
given folders fail with EROFS, as on a read-only mount.

    python -m pytest -q tests/training/test_index_cache_folders.py
"""
import errno
import os
import shutil
import tempfile

import numpy as np
import pytest

from megatron_zaya.arguments import parse_args
from tests.training.conftest import run_tool
from tests.training.helpers import tiny_run_flags


@pytest.fixture
def read_only(monkeypatch):
    """read_only(*folders): creating a folder or a file directly in one of them fails as on a read-only file
    system (as the checks try it: tempfile.mkdtemp, tempfile.mkstemp)."""
    refused = set()

    def or_erofs(make):
        def made(*args, **kwargs):
            if os.path.abspath(kwargs.get("dir") or "") in refused:
                raise OSError(errno.EROFS, "Read-only file system", kwargs["dir"])
            return make(*args, **kwargs)
        return made
    monkeypatch.setattr(tempfile, "mkdtemp", or_erofs(tempfile.mkdtemp))
    monkeypatch.setattr(tempfile, "mkstemp", or_erofs(tempfile.mkstemp))
    return lambda *folders: refused.update(os.path.abspath(f) for f in folders)


def _copy(tiny_corpus, folder) -> str:
    """The corpus's .bin/.idx copied into `folder` (made): the new prefix."""
    os.makedirs(folder, exist_ok=True)
    prefix = os.path.join(folder, "docs_text_document")
    for ext in (".bin", ".idx"):
        shutil.copyfile(tiny_corpus[0] + ext, prefix + ext)
    return prefix


def _error_line(argv, capsys, run=parse_args) -> str:
    with pytest.raises(SystemExit) as stopped:
        run(argv)
    assert stopped.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_every_data_folders_default_cache_is_checked(tiny_corpus, tmp_path, capsys, read_only):
    """A blend whose second dataset lies in a read-only folder: its cache folder is named (only the first
    dataset's was checked, and the run failed once its indices were built)."""
    first, second = _copy(tiny_corpus, tmp_path / "rw"), _copy(tiny_corpus, tmp_path / "ro")
    read_only(tmp_path / "ro")
    blend = {"--data-path": ["0.5", first, "0.5", second], "--data-cache-path": None}
    line = _error_line(tiny_run_flags(tiny_corpus, tmp_path, **blend), capsys)
    assert (f"index cache (no --data-cache-path; default beside the data) {tmp_path}/ro/cache/GPTDataset_indices: "
            f"cannot create folders in {tmp_path}/ro (Read-only file system); give --data-cache-path a writable "
            f"folder") in line, line
    assert "--no-index-cache" not in line, line              # pretrain_zaya.py has no such flag
    read_only()         # nothing more refused: the same blend passes, and the check leaves no folder behind
    shutil.rmtree(tmp_path / "ro")
    second = _copy(tiny_corpus, tmp_path / "ro2")
    parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{**blend, "--data-path": ["0.5", first, "0.5", second]}))
    assert sorted(os.listdir(tmp_path)) == ["ro2", "rw"] and sorted(os.listdir(tmp_path / "rw")) == [
        "docs_text_document.bin", "docs_text_document.idx"]


@pytest.mark.parametrize("explicit", [False, True])
def test_an_existing_read_only_cache_folder_is_read_and_an_index_missing_there_built_in_memory(
        tiny_corpus, tmp_path, read_only, capsys, explicit):
    """cache/GPTDataset_indices (or a --data-cache-path) already there but read-only: a read-only data folder whose
    indices were built beforehand, or a team's shared cache. A warning, not a refusal (the indices there are read as
    they are); an index missing there (a `chmod -R a-w` moves the files' ctime, which the index check's record is
    keyed by) is built in memory, with one warning naming the folder (it was an OSError from the lock file), also
    where a killed build left its lock (every process waited for it until the timeout)."""
    from megatron_zaya.data import cache as index_cache
    prefix = _copy(tiny_corpus, tmp_path / "data")
    folder = tmp_path / "shared" if explicit else tmp_path / "data" / "cache" / "GPTDataset_indices"
    folder.mkdir(parents=True)
    read_only(folder)
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--data-path": prefix,
                                                              "--data-cache-path": str(folder) if explicit else None}))
    label = "--data-cache-path" if explicit else "index cache (no --data-cache-path; default beside the data)"
    assert [w for w in run.warnings if "cannot create folders" in w] == [
        f"{label} {folder}: cannot create folders in {folder} (Read-only file system): indices not built there "
        f"yet are built in memory, by every process, at every start (give --data-cache-path a writable folder to "
        f"keep them)"]

    # a lock a killed build left there: no process waits for it (it held every one until the hour's timeout)
    (folder / f"{index_cache.description_hash({'k': 1})}.lock").write_text("elsewhere:999999")
    capsys.readouterr()
    for _ in range(2):
        out = index_cache.cached_arrays(str(folder), f"Test{explicit}", {"k": 1}, ["x"], lambda: {"x": np.ones(2)},
                                        timeout_s=5)
        assert out["x"].tolist() == [1, 1] and len(os.listdir(folder)) == 1
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning: index cache" in line]
    assert len(warned) == 1 and warned[0].endswith(
        f"warning: index cache {folder}: cannot write there (Read-only file system): the indices not built there "
        f"are built in memory, by every process, at every start (give --data-cache-path a writable folder to keep "
        f"them)"), warned


def _evaluate_argv(tiny_corpus, prefix, *extra) -> list[str]:
    return ["--load", "/nonexistent/not_loaded", "--data-path", prefix, "--tokenizer-type",
            "GPTSentencePieceTokenizer", "--tokenizer-model", tiny_corpus[1], "--seq-length", "32", "--eval-iters", "2",
            *extra]


def test_evaluate_checks_the_index_cache_folders_before_loading(tiny_corpus, tmp_path, capsys, read_only):
    """evaluate.py on data in a read-only folder (the default cache beside it), or with a read-only
    --data-cache-path: one error line naming the folder and what to give instead, before the checkpoint is
    loaded (it was an OSError traceback from the index cache, after the load); --no-index-cache needs none."""
    def evaluate(argv):
        return run_tool("evaluate", argv)
    prefix = _copy(tiny_corpus, tmp_path / "ro")
    os.makedirs(tmp_path / "ro_parent")
    read_only(tmp_path / "ro", tmp_path / "ro_parent")
    line = _error_line(_evaluate_argv(tiny_corpus, prefix), capsys, evaluate)
    assert line.split(": error: ", 1)[1] == (f"index cache (no --data-cache-path; default beside the data) "
                    f"{tmp_path}/ro/cache/GPTDataset_indices: cannot create folders in {tmp_path}/ro (Read-only file "
                    f"system); give --data-cache-path a writable folder or --no-index-cache"), line
    line = _error_line(_evaluate_argv(tiny_corpus, prefix, "--data-cache-path", str(tmp_path / "ro_parent/cache")),
                       capsys, evaluate)
    assert (f"--data-cache-path {tmp_path}/ro_parent/cache: cannot create folders in {tmp_path}/ro_parent (Read-only "
            f"file system); give --data-cache-path a writable folder or --no-index-cache") in line, line
    # --no-index-cache: no folder to write, past the check to the checkpoint
    line = _error_line(_evaluate_argv(tiny_corpus, prefix, "--no-index-cache"), capsys, evaluate)
    assert "/nonexistent/not_loaded" in line and "cache" not in line, line


@pytest.mark.parametrize("where", ["check", "write"])
def test_a_full_cache_folder_is_named_on_one_line(tmp_path, monkeypatch, where):
    """No space (or quota) left where the cache writes, out of inodes (the check's file fails) or of blocks (the
    check passes and the arrays' write fails): an OSError naming the folder as its file, which pretrain_zaya.py
    prints as one line, and what to do (it named a temporary file of the check, or no file: a traceback)."""
    import pretrain_zaya
    from megatron_zaya.data import cache as index_cache

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(*((tempfile, "mkstemp") if where == "check" else (index_cache, "_build_and_write")), full)
    with pytest.raises(OSError) as raised:
        index_cache.cached_arrays(str(tmp_path), "Test", {"k": 1}, ["x"], lambda: {"x": np.ones(2)})
    assert pretrain_zaya.user_error_line(raised.value) == (
        f"{tmp_path}: the index cache has no space left (No space left on device): free space there or give "
        f"--data-cache-path another folder")
    assert os.listdir(tmp_path) == []                      # (the lock is released)
