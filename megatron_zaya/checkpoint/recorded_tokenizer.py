"""The tokenizer flags a training run recorded in its checkpoints (metadata.json "args").

The tools that read a checkpoint (tools/generate.py, the text generation server, tools/evaluate.py,
convert_checkpoint.py to-hf / average) take them when they are given no tokenizer flag
(`recorded_tokenizer_of`), as --use-checkpoint-args does for a training run (`recorded_tokenizer`).
File flags (--tokenizer-model, --vocab-file, --merge-file) are stored as the run was given them: a
relative path is looked up from the directory the run was started in (metadata "working_directory") and from
the current directory; where both hold it as different files, the run's is taken (the file training read) and
a warning names both.
"""
from __future__ import annotations

import dataclasses
import filecmp
import os
import warnings

from megatron_zaya.checkpoint.format import METADATA_FILE, CheckpointError, read_json
from megatron_zaya.checkpoint.inspection import resolve_folder
from megatron_zaya.data.tokenizer import TOKENIZER_DESTS, flag_of, flags_text, tokenizer_flags

FILE_ARGS = ("tokenizer_model", "vocab_file", "merge_file")


@dataclasses.dataclass
class RecordedTokenizer:
    """`flags`: the recorded tokenizer settings by argparse dest, file paths resolved where found;
    `missing`: the file flags whose path was found neither here nor from the run's directory."""
    flags: dict
    missing: list[str]
    source: str                 # the metadata file they come from

    @property
    def reads_text(self) -> bool:
        return self.flags["tokenizer_type"] != "NullTokenizer"     # --mock-data's tokenizer has no text

    def command_line(self) -> str:
        return flags_text(tokenizer_flags(self.flags))

    def missing_message(self) -> str:
        files = ", ".join(f"{flag_of(dest)} {self.flags[dest]}" for dest in self.missing)
        return f"the run that saved it used {files}, which is not found from here"


def _same_file(a: str, b: str) -> bool:
    """`a` and `b` name one file (or folder), or two files of the same contents."""
    try:
        return os.path.samefile(a, b) or (os.path.isfile(a) and os.path.isfile(b) and filecmp.cmp(a, b, shallow=False))
    except OSError:
        return False


def _resolve(flag: str, path: str, run_directory: str | None) -> str | None:
    """Where the recorded `path` of `flag` is found: as it is (absolute, or from the current folder), or from the
    folder the run was started in (`run_directory`). A relative path found from both that names two different
    files is the run directory's, the file the training run read, with a warning naming both (the current
    folder's was taken, silently: another tokenizer than the model's)."""
    here = path if os.path.exists(path) else None
    if os.path.isabs(path) or not run_directory:
        return here
    there = os.path.join(run_directory, path)
    if not os.path.exists(there) or (here is not None and _same_file(here, there)):
        return here
    if here is not None:
        warnings.warn(f"the checkpoint's recorded {flag} {path} names two different files: {there} (from the "
                      f"folder the training run was started in) and {os.path.abspath(here)} (from the current "
                      f"folder); using {there}, the one the run read (give the tokenizer flags to choose)",
                      stacklevel=3)
    return there


def recorded_tokenizer(meta: dict, source: str = METADATA_FILE) -> RecordedTokenizer | None:
    """The tokenizer of checkpoint metadata `meta`; None when the run recorded none (no args: an
    offline conversion)."""
    saved = meta.get("args") or {}
    if saved.get("tokenizer_type") is None:
        return None
    flags = {dest: saved[dest] for dest in TOKENIZER_DESTS if saved.get(dest) is not None}
    missing = []
    for dest in FILE_ARGS:
        if dest in flags and not (dest == "tokenizer_model" and flags["tokenizer_type"] == "NullTokenizer"):
            # (a NullTokenizer's --tokenizer-model is its vocabulary size, no file)
            found = _resolve(flag_of(dest), str(flags[dest]), meta.get("working_directory"))
            if found is None:
                missing.append(dest)
            else:
                flags[dest] = found
    return RecordedTokenizer(flags, missing, source)


def recorded_tokenizer_of(path: str) -> RecordedTokenizer | None:
    """recorded_tokenizer of the checkpoint at `path` (an iter_NNNNNNN folder or a --save folder: its
    latest), if it reads text; None where there is none or no readable metadata (the loader reports that)."""
    try:
        metadata = os.path.join(resolve_folder(path), METADATA_FILE)
        recorded = recorded_tokenizer(read_json(metadata), metadata)
    except CheckpointError:
        return None
    return recorded if recorded is not None and recorded.reads_text else None


def adopt_recorded_tokenizer(args, path: str) -> tuple[RecordedTokenizer | None, str | None]:
    """Set `args`' tokenizer flags to those the training run that saved the checkpoint at `path` recorded:
    (recorded, None); (None, why) when their files are not found from here; (None, None) when it recorded
    none that reads text."""
    recorded = recorded_tokenizer_of(path)
    if recorded is None:
        return None, None
    if recorded.missing:
        return None, recorded.missing_message()
    vars(args).update(recorded.flags)
    return recorded, None
