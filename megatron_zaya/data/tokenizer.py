"""Tokenizers with Megatron-LM's names and special-token conventions.

`build_tokenizer(tokenizer_type, tokenizer_model, make_vocab_size_divisible_by=128, vocab_file=None,
merge_file=None)` accepts:

- `GPTSentencePieceTokenizer`: a SentencePiece model used as is; EOD is the model's EOS id,
  text is encoded as plain SentencePiece ids (Megatron's `_GPTSentencePieceTokenizer`).
- `SentencePieceTokenizer`: Megatron's `_SentencePieceTokenizer`: the SentencePiece vocabulary plus
  the special tokens <CLS> <SEP> <EOD> <MASK> (and <PAD>/<BOS>/<EOS> when the model lacks them),
  each appended at the end of the vocabulary when not already a piece; literal occurrences of those
  tokens in the text are encoded as their ids; EOD is the <EOD> id.
- `HuggingFaceTokenizer`: a local Hugging Face `tokenizer.json` (a file, or a directory holding it and
  optionally `tokenizer_config.json` / `special_tokens_map.json`), loaded with the `tokenizers`
  package, no hub access. Like Megatron (which calls `AutoTokenizer(text).input_ids`) encoding adds
  the post-processor's special tokens (e.g. Gemma's <bos>); EOD is the EOS token. As in
  transformers 5, `add_bos_token` / `add_eos_token` in `tokenizer_config.json` do not override the
  post-processor of a `tokenizer.json` (tests/data/test_tokenizer.py checks the ids against
  transformers' own loading of the same folder).
- `GPT2BPETokenizer`: GPT-2's byte-level BPE from a `vocab.json` and a `merges.txt` (Megatron's
  `--vocab-file` / `--merge-file`; or `tokenizer_model` = a folder holding them, as `vocab.json` +
  `merges.txt` or Megatron's `gpt2-vocab.json` + `gpt2-merges.txt`). As Megatron's legacy GPT-2
  tokenizer, no text is special: `<|endoftext|>` in a document is encoded as ordinary text, and EOD
  is the `<|endoftext|>` id. Encoded by the `tokenizers` package (GPT-2's pre-tokenizing pattern and
  merge ranks); tests/data/test_gpt2_tokenizer.py checks it against a pure-Python GPT-2 BPE.
- `Llama2Tokenizer`: a SentencePiece model with BOS prepended to every encoded text (Megatron's
  `_Llama2Tokenizer.tokenize(s, bos=True, eos=False)`); EOD is the model's EOS id.
- `TikTokenizer`: Megatron-LM's tiktoken-based byte-level BPE from a JSON list of ranks, with its
  special tokens first (`--tiktoken-pattern`, `--tiktoken-num-special-tokens`,
  `--tokenizer-special-tokens`, and `--vocab-size` as the tokenizer's size): see tokenizer_tiktoken.py.
- `NullTokenizer`: `tokenizer_model` is a vocabulary size; text is space-separated integer ids and
  EOD is the id just past the vocabulary (Megatron's convention), handy for tests.

Every tokenizer exposes `vocab_size` (unpadded), `padded_vocab_size`, `eod`, `bos`, `pad`,
`encode(text)`, `encode_batch(texts)`, `decode(ids)`.
"""

from __future__ import annotations

import os
import re
from typing import Sequence

from megatron_zaya.errors import UserInputError

from .tokenizer_base import BaseTokenizer, other_kind_hint, pad_vocab_size
from .tokenizer_hf import GPT2BPETokenizer, HuggingFaceTokenizer, gpt2_bpe_files, missing_tokenizer_json
from .tokenizer_sentencepiece import GPTSentencePieceTokenizer, Llama2Tokenizer, SentencePieceTokenizer
from .tokenizer_tiktoken import TikTokenizer, check_tiktoken_settings

__all__ = ["BaseTokenizer", "pad_vocab_size", "HuggingFaceTokenizer", "GPT2BPETokenizer", "GPTSentencePieceTokenizer",
           "SentencePieceTokenizer", "Llama2Tokenizer", "NullTokenizer", "TikTokenizer", "TOKENIZER_TYPES",
           "check_tokenizer_flags", "build_tokenizer", "add_tiktoken_arguments", "tiktoken_options",
           "null_tokenizer_size_from_vocab_size"]


class NullTokenizer(BaseTokenizer):
    """Text is space-separated integer ids; EOD = the id right after the vocabulary."""

    name = "NullTokenizer"

    def __init__(self, vocab_size, **kw):
        super().__init__(**kw)
        try:
            base = int(vocab_size)
        except (TypeError, ValueError):
            raise UserInputError(f"--tokenizer-model for NullTokenizer must be the vocabulary size, got {vocab_size!r}") from None
        self._eod = base
        self._vocab_size = base + 1
        self._bos = None
        self._pad = None

    def encode(self, text: str) -> list[int]:
        return [int(x) for x in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(str(int(i)) for i in ids)


TOKENIZER_TYPES = {
    "GPTSentencePieceTokenizer": GPTSentencePieceTokenizer,
    "SentencePieceTokenizer": SentencePieceTokenizer,
    "Llama2Tokenizer": Llama2Tokenizer,
    "GPT2BPETokenizer": GPT2BPETokenizer,
    "HuggingFaceTokenizer": HuggingFaceTokenizer,
    "TikTokenizer": TikTokenizer,
    "NullTokenizer": NullTokenizer,
}

# TikTokenizer's settings: the keyword arguments of build_tokenizer / check_tokenizer_flags, and the
# attributes of the same names on a parsed namespace or a config (`tokenizer_vocab_size` is the
# tokenizer's --vocab-size; pretrain_zaya.py's own --vocab-size is the model's).
TIKTOKEN_SETTINGS = ("tiktoken_pattern", "tiktoken_num_special_tokens", "tokenizer_special_tokens")


def add_tiktoken_arguments(group, vocab_size_flag: bool = True) -> None:
    """TikTokenizer's flags, by Megatron-LM's names. `vocab_size_flag`: also --vocab-size, as the
    tokenizer's size (tools without a model vocabulary of their own)."""
    group.add_argument("--tiktoken-pattern", choices=("v1", "v2"), default=None,
                       help="TikTokenizer: Megatron-LM's pre-tokenization pattern")
    group.add_argument("--tiktoken-num-special-tokens", type=int, default=None,
                       help="TikTokenizer: ids reserved for special tokens, before the ranks (default 1000)")
    group.add_argument("--tokenizer-special-tokens", "--tiktoken-special-tokens", nargs="+", default=None,
                       dest="tokenizer_special_tokens",
                       help="TikTokenizer: the special tokens (default <unk> <s> </s>; these three are required; "
                            "--tiktoken-special-tokens is Megatron-LM's older name)")
    if vocab_size_flag:
        group.add_argument("--vocab-size", dest="tokenizer_vocab_size", type=int, default=None,
                           help="TikTokenizer: its vocabulary size, special tokens included (default 131072); "
                                "NullTokenizer without --tokenizer-model: its size, as in Megatron-LM")


def null_tokenizer_size_from_vocab_size(args) -> None:
    """Megatron-LM's `--tokenizer-type NullTokenizer --vocab-size N` (no --tokenizer-model) rewritten into
    this project's form, --tokenizer-model N, in a tool's parsed flags (add_tiktoken_arguments' --vocab-size
    is the tokenizer's size there)."""
    if (args.tokenizer_type == "NullTokenizer" and args.tokenizer_model is None
            and getattr(args, "tokenizer_vocab_size", None) is not None):
        args.tokenizer_model, args.tokenizer_vocab_size = str(args.tokenizer_vocab_size), None


TOKENIZER_DESTS = ("tokenizer_type", "tokenizer_model", "vocab_file", "merge_file") + TIKTOKEN_SETTINGS + (
    "tokenizer_vocab_size",)


def flag_of(dest: str) -> str:
    """The command-line flag of a tokenizer setting's argparse dest (tokenizer_vocab_size: --vocab-size)."""
    return "--vocab-size" if dest == "tokenizer_vocab_size" else "--" + dest.replace("_", "-")


def tokenizer_from_flags_dict(flags: dict) -> BaseTokenizer:
    """build_tokenizer of {flag: value} as tokenizer_flags gives them (e.g. a dataset's tokenizer record)."""
    settings = {("tokenizer_vocab_size" if flag == "--vocab-size" else flag[2:].replace("-", "_")): value
                for flag, value in flags.items()}
    return build_tokenizer(settings.pop("tokenizer_type"), settings.pop("tokenizer_model", None), **settings)


def tokenizer_flags(source) -> dict:
    """{flag: value} of the tokenizer settings set in `source` (a namespace or config, or a dict by dest)."""
    get = source.get if isinstance(source, dict) else (lambda dest: getattr(source, dest, None))
    return {flag_of(dest): get(dest) for dest in TOKENIZER_DESTS if get(dest) is not None}


def flags_text(flags: dict) -> str:
    """{flag: value} as on a command line."""
    return " ".join(f"{flag} {' '.join(map(str, v)) if isinstance(v, list) else v}" for flag, v in flags.items())


def tiktoken_options(source) -> dict:
    """The TikTokenizer keyword arguments of build_tokenizer from a namespace or config that has
    TIKTOKEN_SETTINGS and `tokenizer_vocab_size` attributes (missing or None ones are left out)."""
    names = TIKTOKEN_SETTINGS + ("tokenizer_vocab_size",)
    found = {name: getattr(source, name, None) for name in names}
    return {name: value for name, value in found.items() if value is not None}


def check_tokenizer_flags(tokenizer_type: str, tokenizer_model, vocab_file: str | None = None,
                          merge_file: str | None = None, **tiktoken) -> None:
    """Cheap checks of --tokenizer-type / --tokenizer-model (and GPT-2's --vocab-file / --merge-file)
    before anything is built or loaded.

    The type must be a known one. GPT2BPETokenizer needs its two files, from --vocab-file and
    --merge-file or from a folder given as --tokenizer-model; every other type needs
    --tokenizer-model: a vocabulary size (an integer >= 1) for NullTokenizer, a tokenizer.json or a
    folder holding one for HuggingFaceTokenizer, and a SentencePiece model file otherwise; the two
    GPT-2 flags are refused with any other type. TikTokenizer's settings (`tiktoken`: the keyword
    arguments of `tiktoken_options`) are checked with it and refused with any other type. Raises
    `UserInputError` naming the flag.
    """
    if tokenizer_type not in TOKENIZER_TYPES:
        raise UserInputError(f"--tokenizer-type {tokenizer_type!r} is not supported; "
                             f"choose one of {sorted(TOKENIZER_TYPES)}")
    if tokenizer_type == "GPT2BPETokenizer":
        gpt2_bpe_files(tokenizer_model, vocab_file, merge_file)
        return
    for flag, value in (("--vocab-file", vocab_file), ("--merge-file", merge_file)):
        if value is not None:
            raise UserInputError(f"{flag} is read only by --tokenizer-type GPT2BPETokenizer, not {tokenizer_type}")
    if tokenizer_type != "TikTokenizer":
        for name, value in tiktoken.items():
            if value is not None:
                raise UserInputError(f"{flag_of(name)} is read only by --tokenizer-type TikTokenizer, not "
                                     f"{tokenizer_type}")
    if tokenizer_model is None:
        what = "the vocabulary size" if tokenizer_type == "NullTokenizer" else "a tokenizer file"
        raise UserInputError(f"--tokenizer-type {tokenizer_type} needs --tokenizer-model ({what})")
    if tokenizer_type == "NullTokenizer":
        if not re.fullmatch(r"\s*\d+\s*", str(tokenizer_model)) or int(tokenizer_model) < 1:
            raise UserInputError(f"--tokenizer-model {tokenizer_model!r}: NullTokenizer takes the vocabulary size, "
                                 f"an integer >= 1")
    elif tokenizer_type == "HuggingFaceTokenizer":
        path = str(tokenizer_model)
        if not (os.path.isfile(path) or os.path.isfile(os.path.join(path, "tokenizer.json"))):
            raise UserInputError(missing_tokenizer_json(path))
    elif tokenizer_type == "TikTokenizer":
        check_tiktoken_settings(tokenizer_model, tiktoken.get("tiktoken_pattern"), tiktoken.get("tokenizer_vocab_size"),
                                tiktoken.get("tiktoken_num_special_tokens"), tiktoken.get("tokenizer_special_tokens"))
    elif not os.path.isfile(str(tokenizer_model)):
        raise UserInputError(f"--tokenizer-model {tokenizer_model}: SentencePiece model file not found"
                             f"{other_kind_hint(str(tokenizer_model), tokenizer_type)}")


def build_tokenizer(tokenizer_type: str, tokenizer_model, make_vocab_size_divisible_by: int = 128,
                    tensor_parallel_size: int = 1, vocab_file: str | None = None, merge_file: str | None = None,
                    **kwargs) -> BaseTokenizer:
    """Build a tokenizer by Megatron's `--tokenizer-type` name from `--tokenizer-model` (GPT2BPETokenizer:
    from `vocab_file` / `merge_file`, each defaulting to its file in the folder `tokenizer_model`;
    TikTokenizer: with the keyword arguments of `tiktoken_options`)."""
    tiktoken = {name: kwargs.pop(name) for name in TIKTOKEN_SETTINGS + ("tokenizer_vocab_size",) if name in kwargs}
    check_tokenizer_flags(tokenizer_type, tokenizer_model, vocab_file, merge_file, **tiktoken)
    cls = TOKENIZER_TYPES[tokenizer_type]
    if tokenizer_type == "GPT2BPETokenizer":
        kwargs.update(vocab_file=vocab_file, merge_file=merge_file)
    if tokenizer_type == "TikTokenizer":
        kwargs.update(tiktoken)
    return cls(tokenizer_model, make_vocab_size_divisible_by=make_vocab_size_divisible_by,
               tensor_parallel_size=tensor_parallel_size, **kwargs)
