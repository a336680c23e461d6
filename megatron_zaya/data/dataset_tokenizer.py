"""Which tokenizer wrote a dataset, so that a run with another one stops before the model is built.

tools/preprocess_data.py leaves `PREFIX.tokenizer.json` beside `PREFIX.bin` / `PREFIX.idx` (Megatron-LM's
pair itself is unchanged; the file is this repository's). It holds the tokenizer flags, for people, and
what identifies the tokenizer's behaviour, for the check: its vocabulary size, its EOD id and the sha256
of the ids it encodes a fixed probe text to (PROBE_TEXT: prose, code, digits, runs of spaces and newlines,
other scripts, emoji). Two tokenizers that differ in how they encode it differ there, whatever their file
formats; one tokenizer gives the same digest from any copy of its files.

A run (and tools/evaluate.py) compares every dataset it reads that has the file with its own tokenizer
(`check_dataset_tokenizers`): a dataset of another tokenizer is one line naming both, before the model is
built. Its token ids may all lie inside this run's vocabulary, where the token-id check (loaders.
check_token_ids) sees nothing. A dataset without the file (Megatron-LM's preprocessing, an older one) is
not checked. tools/merge_datasets.py carries the file over when its inputs agree and refuses inputs of
different tokenizers.
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from megatron_zaya.data.indexed import strip_suffix
from megatron_zaya.data.tokenizer import flags_text
from megatron_zaya.errors import UserInputError
from megatron_zaya.leftovers import temporary_suffix

SUFFIX = ".tokenizer.json"
IDENTITY_KEYS = ("vocab_size", "eod", "probe_sha256")
PROBE_TEXT = (
    "The quick brown fox jumps over the lazy dog. It's 3:45 p.m. on 2024-03-17; pi = 3.14159, 1,000,000 + 42%.\n"
    "def tokenize(text: str) -> list[int]:\n    return [ord(c) for c in text]  # spaces    and\ttabs\n\n\n"
    "    <html><body class=\"x\">&amp; {\"key\": [1, 2, 3]}</body></html>\n"
    "Größe, café, naïve, Ελληνικά, русский, עברית, العربية, हिन्दी, 中文汉字, 日本語のテキスト, 한국어 🙂🚀\n"
    "ALL CAPS, MiXeD cAsE, snake_case_name, CamelCaseName, e-mail@example.com, https://example.org/a?b=c#d"
)


def record_path(prefix: str) -> str:
    """PREFIX.tokenizer.json of a dataset prefix (also given as its .bin or .idx, which the reader accepts)."""
    return strip_suffix(prefix) + SUFFIX


def tokenizer_identity(tokenizer) -> dict:
    """The vocabulary size, EOD id and probe digest of `tokenizer` (a NullTokenizer, which reads no text,
    has no probe digest)."""
    try:
        ids = tokenizer.encode(PROBE_TEXT)
    except ValueError:           # NullTokenizer: text is space-separated ids
        digest = None
    else:
        digest = hashlib.sha256(np.asarray(ids, dtype="<i8").tobytes()).hexdigest()
    return {"vocab_size": int(tokenizer.vocab_size), "eod": int(tokenizer.eod), "probe_sha256": digest}


def tokenizer_record(tokenizer, flags: dict) -> dict:
    """What PREFIX.tokenizer.json holds: `flags` ({"--tokenizer-type": ..., ...}, the given ones) and the identity."""
    return {"tokenizer_flags": {k: v for k, v in flags.items() if v is not None},
            **tokenizer_identity(tokenizer)}


def describe(record: dict) -> str:
    return flags_text(record.get("tokenizer_flags", {}))


def write_record(prefix: str, record: dict) -> None:
    """Writes PREFIX.tokenizer.json whole or not at all (a temporary file renamed into place)."""
    path = record_path(prefix)
    temporary = path + temporary_suffix()      # another machine's process of the same id has another name
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1, ensure_ascii=False)
            f.write("\n")
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def remove_record(prefix: str) -> None:
    try:
        os.remove(record_path(prefix))
    except FileNotFoundError:
        pass


def read_record(prefix: str) -> dict | None:
    """PREFIX.tokenizer.json, or None when there is none; UserInputError naming it when it is unreadable."""
    path = record_path(prefix)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError) as err:
        raise UserInputError(f"{path}: unreadable ({err}); it records which tokenizer wrote {prefix}: remove it to "
                             f"skip that check") from None
    if not isinstance(record, dict) or not all(k in record for k in IDENTITY_KEYS):
        raise UserInputError(f"{path}: not a tokenizer record (it needs {', '.join(IDENTITY_KEYS)}); remove it to "
                             f"skip the check of {prefix}'s tokenizer")
    return record


def differences(record: dict, other: dict, names: tuple[str, str] = ("the dataset's", "this run's")) -> list[str]:
    """What differs between a dataset's record and another record or a tokenizer's identity, in words."""
    out = []
    for key, words in (("vocab_size", "vocabulary size"), ("eod", "EOD id")):
        if record[key] != other[key]:
            out.append(f"{names[0]} {words} is {record[key]}, {names[1]} {other[key]}")
    if record["probe_sha256"] != other["probe_sha256"]:
        out.append("a test text encodes to other ids")
    return out


def check_dataset_tokenizers(prefixes, tokenizer, run_flags: str, flag: str = "--data-path") -> None:
    """UserInputError naming the first dataset of `prefixes` whose PREFIX.tokenizer.json says another
    tokenizer wrote it than `tokenizer` (this run's, given by the flags `run_flags`)."""
    identity = None
    for prefix in prefixes:
        record = read_record(prefix)
        if record is None:
            continue
        identity = identity or tokenizer_identity(tokenizer)
        differ = differences(record, identity)
        if differ:
            raise UserInputError(
                f"{flag} {prefix} was preprocessed with {describe(record) or 'another tokenizer'} "
                f"({record_path(prefix)}), not this run's {run_flags}: {'; '.join(differ)}. Train with that "
                f"tokenizer or preprocess the data again with this one (if both are the same tokenizer and only a "
                f"library update changed its ids, remove {record_path(prefix)})")
