"""Where an output that is not there yet would go: `nearest_existing(path)`, the one walk up to the closest
folder that exists, which the checks of an output path (training's folders, the tools' output files and
folders, a Hugging Face export) share; `check_creatable_dir`, the check of a folder a run will write in; and
the index cache's folders (`default_cache_dir` beside each dataset, or --data-cache-path), which
pretrain_zaya.py and tools/evaluate.py check with `check_index_cache_dirs` before any model is loaded."""
from __future__ import annotations

import os
import tempfile

from megatron_zaya.errors import UserInputError

DEFAULT_CACHE_LABEL = "index cache (no --data-cache-path; default beside the data)"


class DanglingLink(UserInputError):
    """A symbolic link on the way to an output path points at nothing: no folder can be made through it."""


def nearest_existing(path, named: str = "") -> str:
    """`path` (absolute) or its closest ancestor that exists: where the missing folders of `path` would be made
    (a file there means they cannot be). DanglingLink where `path` or an ancestor on the way is a symbolic link
    to a missing target (os.makedirs would fail there with "File exists"), its message starting with `named`
    (the flag and value that gave the path) where given."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        if os.path.islink(probe):
            raise DanglingLink(f"{named + ': ' if named else ''}{probe} is a symbolic link to {os.readlink(probe)}, "
                               f"which does not exist (create that folder, or name another)")
        probe = os.path.dirname(probe)
    return probe


def write_refusal(folder: str) -> OSError | None:
    """The error of making a file in `folder` (tried with a temporary file, removed at once: os.access says yes to
    root everywhere, even in /proc or on a read-only mount); None when one can be made."""
    try:
        handle, probe = tempfile.mkstemp(prefix=".megatron-zaya-check-", dir=folder)
    except OSError as err:
        return err
    os.close(handle)
    os.remove(probe)
    return None


def check_creatable_dir(flag: str, path: str) -> None:
    """`path` is a directory this process can write in, or can be created: it (or, when it is not there yet, its
    nearest existing ancestor) is a directory in which a folder can be made (`write_refusal`)."""
    probe = nearest_existing(path, f"{flag} {path}")
    if probe == os.path.abspath(path) and not os.path.isdir(probe):
        raise UserInputError(f"{flag} {path}: exists and is not a directory")
    if not os.path.isdir(probe):
        raise UserInputError(f"{flag} {path}: {probe} is not a directory")
    refused = write_refusal(probe)
    if refused is not None:
        raise UserInputError(f"{flag} {path}: cannot create folders in {probe} ({refused.strerror})")


def default_cache_dir(path_prefix: str) -> str:
    """A `cache/GPTDataset_indices` folder beside the data (Megatron-LM's default puts that folder inside a
    directory named as the prefix itself, `PREFIX/cache/GPTDataset_indices`, next to PREFIX.bin)."""
    return os.path.join(os.path.dirname(os.path.abspath(path_prefix)), "cache", "GPTDataset_indices")


def check_index_cache_dirs(prefixes: list[str], data_cache_path: str | None, no_cache_flag: str = "") -> list[str]:
    """The folders the index cache writes in can be written: --data-cache-path, or without it the default
    folder beside each distinct data folder of `prefixes` (every dataset's indices and index check go beside
    it; the blend's beside the first). UserInputError naming the folder, and what to give instead:
    --data-cache-path, or `no_cache_flag` (tools/evaluate.py's --no-index-cache) where there is one. A folder
    that exists and cannot be written is a warning (returned): indices built there beforehand are read as they are
    (a read-only data folder, a team's shared cache), and data/cache.py builds in memory any that are missing."""
    instead = f"give --data-cache-path a writable folder{f' or {no_cache_flag}' if no_cache_flag else ''}"
    if data_cache_path:
        folders = [data_cache_path]
    else:
        folders = list(dict.fromkeys(default_cache_dir(prefix) for prefix in prefixes))
    warnings = []
    for folder in folders:
        label = "--data-cache-path" if data_cache_path else DEFAULT_CACHE_LABEL
        try:
            check_creatable_dir(label, folder)
        except UserInputError as err:
            if not os.path.isdir(folder):
                raise UserInputError(f"{err}; {instead}") from None
            warnings.append(f"{err}: indices not built there yet are built in memory, by every process, at every "
                            f"start ({instead} to keep them)")
    return warnings
