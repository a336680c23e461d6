"""The index cache's folders (megatron_zaya.paths.check_index_cache_dirs) are checked before any model is built or
loaded, by pretrain_zaya.py and tools/evaluate.py alike: --data-cache-path, or without it the default folder beside
EVERY data folder of the blend (each dataset's indices go beside it; only the first one's was checked), an existing
one included (it was skipped: one that cannot be written is a warning, and an index missing there is named when
it is to be built). evaluate.py checked none and failed with a traceback after loading the model.

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
from megatron_zaya.errors import UserInputError
from tests.training.conftest import run_tool
from tests.training.helpers import tiny_run_flags


@pytest.fixture
def read_only(monkeypatch):
    """read_only(*folders): creating a folder directly in one of them fails as on a read-only file system."""
    refused, mkdtemp = set(), tempfile.mkdtemp

    def mkdtemp_or_erofs(*args, **kwargs):
        if os.path.abspath(kwargs.get("dir") or "") in refused:
            raise OSError(errno.EROFS, "Read-only file system", kwargs["dir"])
        return mkdtemp(*args, **kwargs)
    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp_or_erofs)
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


def test_an_existing_read_only_default_cache_folder_is_read_and_an_index_missing_there_named(
        tiny_corpus, tmp_path, read_only, monkeypatch):
    """cache/GPTDataset_indices already there but read-only (a read-only data folder whose indices were built
    beforehand): a warning, not a refusal (the indices there are read as they are); an index missing there stops the
    run naming the folder and --data-cache-path (it was an OSError traceback from the lock file)."""
    from megatron_zaya.data import cache as index_cache
    prefix = _copy(tiny_corpus, tmp_path / "data")
    folder = tmp_path / "data" / "cache" / "GPTDataset_indices"
    folder.mkdir(parents=True)
    read_only(folder)
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--data-path": prefix, "--data-cache-path": None}))
    assert [w for w in run.warnings if "index cache" in w] == [
        f"index cache (no --data-cache-path; default beside the data) {folder}: cannot create folders in {folder} "
        f"(Read-only file system): only indices already built there can be read (give --data-cache-path a writable "
        f"folder to build others)"]

    def read_only_lock(path, observed):
        raise OSError(errno.EROFS, "Read-only file system", path)
    monkeypatch.setattr(index_cache, "_claim", read_only_lock)
    with pytest.raises(UserInputError, match=rf"index cache {folder}: \S+-Test-\*\.npy is not built there, and this "
                                             rf"process cannot write there \(Read-only file system\): give "
                                             rf"--data-cache-path a writable folder"):
        index_cache.cached_arrays(str(folder), "Test", {"k": 1}, ["x"], lambda: {"x": np.ones(2)})


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
    os.makedirs(tmp_path / "ro_cache")
    read_only(tmp_path / "ro", tmp_path / "ro_cache")
    line = _error_line(_evaluate_argv(tiny_corpus, prefix), capsys, evaluate)
    assert line.split(": error: ", 1)[1] == (f"index cache (no --data-cache-path; default beside the data) "
                    f"{tmp_path}/ro/cache/GPTDataset_indices: cannot create folders in {tmp_path}/ro (Read-only file "
                    f"system); give --data-cache-path a writable folder or --no-index-cache"), line
    line = _error_line(_evaluate_argv(tiny_corpus, prefix, "--data-cache-path", str(tmp_path / "ro_cache")), capsys,
                       evaluate)
    assert (f"--data-cache-path {tmp_path}/ro_cache: cannot create folders in {tmp_path}/ro_cache (Read-only file "
            f"system); give --data-cache-path a writable folder or --no-index-cache") in line, line
    # --no-index-cache: no folder to write, past the check to the checkpoint
    line = _error_line(_evaluate_argv(tiny_corpus, prefix, "--no-index-cache"), capsys, evaluate)
    assert "/nonexistent/not_loaded" in line and "cache" not in line, line
