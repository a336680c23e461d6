"""The tokenizer interface every tokenizer type implements, and the vocabulary padding rule."""

from __future__ import annotations

import json
import math
import os
from typing import Sequence

from megatron_zaya.errors import UserInputError


def pad_vocab_size(vocab_size: int, make_vocab_size_divisible_by: int = 128, tensor_parallel_size: int = 1) -> int:
    """Round `vocab_size` up to a multiple of `make_vocab_size_divisible_by` that the tensor-parallel size
    divides (262,145 -> 262,272 = 2049 x 128 for ZAYA1's Gemma-3 vocabulary, at TP 1, 2, 4 or 8).
    Megatron-LM pads to a multiple of their product instead (262,400 at TP 2); the least common multiple
    keeps a checkpoint's vocabulary when only TP changes, so it loads resharded."""
    if int(make_vocab_size_divisible_by) <= 0 or int(tensor_parallel_size) <= 0:
        raise ValueError(f"make_vocab_size_divisible_by={make_vocab_size_divisible_by} and tensor_parallel_size="
                         f"{tensor_parallel_size} must be positive")
    multiple = math.lcm(int(make_vocab_size_divisible_by), int(tensor_parallel_size))
    return ((int(vocab_size) + multiple - 1) // multiple) * multiple


class BaseTokenizer:
    """Common interface; subclasses set `_vocab_size`, `_eod`, `_bos`, `_pad` (and `unk` where they have one)."""

    name = "base"
    unk: int | None = None        # the unknown token's id

    def __init__(self, make_vocab_size_divisible_by: int = 128, tensor_parallel_size: int = 1):
        self.make_vocab_size_divisible_by = make_vocab_size_divisible_by
        self.tensor_parallel_size = tensor_parallel_size

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def padded_vocab_size(self) -> int:
        return pad_vocab_size(self._vocab_size, self.make_vocab_size_divisible_by, self.tensor_parallel_size)

    @property
    def eod(self) -> int:
        return self._eod

    @property
    def bos(self) -> int | None:
        return self._bos

    @property
    def pad(self) -> int | None:
        return self._pad

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    # Megatron's method names, so scripts written against it keep working.
    def tokenize(self, text: str) -> list[int]:
        return self.encode(text)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.decode(ids)


def _to_int_list(ids) -> list[int]:
    return [int(i) for i in ids]


def _load_json(path: str, label: str = ""):
    """The JSON value in `path`; UserInputError naming `label` (e.g. the flag) and the file when it is
    not valid JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise UserInputError(f"{label}{path}: not valid JSON ({e})") from None


def _load_json_object(path: str) -> dict:
    """A JSON object from `path`; UserInputError naming the file when it is not valid JSON or not an object."""
    obj = _load_json(path)
    if not isinstance(obj, dict):
        raise UserInputError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def other_kind_hint(path: str, tried: str) -> str:
    """For an error loading --tokenizer-model `path` as `tried` (a --tokenizer-type): '; it is a <kind>: pass
    --tokenizer-type X' where the file is plainly the other kind of tokenizer (a config file's --tokenizer-type
    can be the cause, which the user does not see on the command line), else ''."""
    if tried == "HuggingFaceTokenizer":
        if os.path.isfile(path):
            import sentencepiece as spm
            try:
                spm.SentencePieceProcessor().Load(path)
            except (OSError, RuntimeError):
                return ""
            return ("; it is a SentencePiece model: pass --tokenizer-type GPTSentencePieceTokenizer (or the "
                    "SentencePiece type it was made for: SentencePieceTokenizer, Llama2Tokenizer)")
        return ""
    if (path.endswith(".json") and os.path.isfile(path)) or os.path.isfile(os.path.join(path, "tokenizer.json")):
        return "; it is a Hugging Face tokenizer: pass --tokenizer-type HuggingFaceTokenizer"
    return ""
