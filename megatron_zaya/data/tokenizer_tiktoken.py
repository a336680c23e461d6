"""TikTokenizer: Megatron-LM's `--tokenizer-type TikTokenizer` (a byte-level BPE given as ranks,
encoded by the `tiktoken` package). See megatron_zaya/data/tokenizer.py for the other types.

The vocabulary file (`--tokenizer-model`) is a JSON list whose entry i is
`{"rank": i, "token_bytes": <base64 of the token's bytes>, "token_str": ...}`; the first 256
entries are the 256 single bytes, in byte order. The layout of ids follows Megatron's:

- ids 0 .. S-1 (S = `--tiktoken-num-special-tokens`, default 1000) are special tokens: the
  `--tokenizer-special-tokens` (default `<unk> <s> </s>`, which must be among them) followed by
  fillers `<SPECIAL_k>` up to S;
- ids S .. V-1 (V = `--vocab-size`, default 2^17) are the first V - S entries of the file, rank r
  becoming id r + S. The file must hold at least V - S entries.

Text is encoded as ordinary text (special tokens written in a document are not special), split by
the `--tiktoken-pattern` (`v1` or `v2`, Megatron's two patterns) and merged by rank. EOD is `</s>`,
BOS `<s>`; there is no pad token.
"""

from __future__ import annotations

import base64
import binascii
import os
from typing import Sequence

from megatron_zaya.errors import UserInputError

from .tokenizer_base import BaseTokenizer, _load_json, _to_int_list

# Megatron-LM's two pre-tokenization patterns (PATTERN_TIKTOKEN and PATTERN_TIKTOKEN_V2), as written there.
TIKTOKEN_PATTERNS = {
    "v1": r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    "v2": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
REQUIRED_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
DEFAULT_VOCAB_SIZE = 1 << 17          # Megatron's fallback when --vocab-size is not given
DEFAULT_NUM_SPECIAL_TOKENS = 1000


def check_tiktoken_settings(path, pattern: str | None, vocab_size: int | None, num_special_tokens: int | None,
                            special_tokens: Sequence[str] | None) -> None:
    """Cheap checks of the TikTokenizer flags (the file is only looked for, not read); None means
    Megatron's default."""
    if path is None:
        raise UserInputError("--tokenizer-type TikTokenizer needs --tokenizer-model (its JSON vocabulary file)")
    if not os.path.isfile(str(path)):
        raise UserInputError(f"--tokenizer-model {path}: TikTokenizer vocabulary file (JSON) not found")
    if pattern not in TIKTOKEN_PATTERNS:
        raise UserInputError(f"--tokenizer-type TikTokenizer needs --tiktoken-pattern v1 or v2 (Megatron-LM's "
                             f"pre-tokenization patterns), got {pattern!r}")
    size = DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size
    if num_special_tokens is None:
        num_special_tokens = DEFAULT_NUM_SPECIAL_TOKENS
    if num_special_tokens < len(REQUIRED_SPECIAL_TOKENS):
        raise UserInputError(f"--tiktoken-num-special-tokens={num_special_tokens}: at least "
                             f"{len(REQUIRED_SPECIAL_TOKENS)} are needed ({' '.join(REQUIRED_SPECIAL_TOKENS)})")
    if size < num_special_tokens + 256:
        raise UserInputError(f"--vocab-size={size} leaves no room for the 256 byte tokens after "
                             f"--tiktoken-num-special-tokens={num_special_tokens} special ones")
    specials = list(REQUIRED_SPECIAL_TOKENS if special_tokens is None else special_tokens)
    duplicates = sorted({t for t in specials if specials.count(t) > 1})
    if duplicates:
        raise UserInputError(f"--tokenizer-special-tokens: {duplicates[0]!r} is given more than once")
    missing = [t for t in REQUIRED_SPECIAL_TOKENS if t not in specials]
    if missing:
        raise UserInputError(f"--tokenizer-special-tokens must include {' '.join(REQUIRED_SPECIAL_TOKENS)} "
                             f"(missing: {' '.join(missing)})")
    if len(specials) > num_special_tokens:
        raise UserInputError(f"--tokenizer-special-tokens: {len(specials)} tokens do not fit in "
                             f"--tiktoken-num-special-tokens={num_special_tokens}")


def load_tiktoken_ranks(path: str, count: int) -> dict[bytes, int]:
    """The first `count` entries of a TikTokenizer vocabulary file as {token bytes: rank}, checked
    entry by entry (UserInputError naming the file and the entry)."""
    entries = _load_json(path, "--tokenizer-model ")
    if not isinstance(entries, list):
        raise UserInputError(f"--tokenizer-model {path}: a TikTokenizer vocabulary is a JSON list of "
                             f"{{rank, token_bytes, token_str}} entries, got a {type(entries).__name__}")
    if len(entries) < count:
        raise UserInputError(f"--tokenizer-model {path}: holds {len(entries)} tokens, but --vocab-size and "
                             f"--tiktoken-num-special-tokens ask for {count} (give --vocab-size = {len(entries)} + "
                             f"the number of special tokens, or fewer)")
    ranks: dict[bytes, int] = {}
    for i, entry in enumerate(entries[:count]):
        where = f"--tokenizer-model {path}: entry {i}"
        if not isinstance(entry, dict) or "rank" not in entry or "token_bytes" not in entry:
            raise UserInputError(f"{where} is not an object with 'rank' and 'token_bytes'")
        if entry["rank"] != i:
            raise UserInputError(f"{where} has rank {entry['rank']!r}; entry i must have rank i")
        try:
            token = base64.b64decode(entry["token_bytes"], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise UserInputError(f"{where}: token_bytes is not base64") from None
        if i < 256 and token != bytes([i]):
            raise UserInputError(f"{where}: the first 256 entries must be the single bytes 0..255 in order")
        if not token or token in ranks:
            raise UserInputError(f"{where}: token {token!r} is empty or already has rank {ranks.get(token)}")
        ranks[token] = i
    return ranks


class TikTokenizer(BaseTokenizer):
    """Megatron-LM's TikTokenizer (CustomTikTokenizer): special tokens first, then the ranks."""

    name = "TikTokenizer"

    def __init__(self, path: str, tiktoken_pattern: str | None = None, tokenizer_vocab_size: int | None = None,
                 tiktoken_num_special_tokens: int | None = None, tokenizer_special_tokens: Sequence[str] | None = None,
                 **kw):
        super().__init__(**kw)
        check_tiktoken_settings(path, tiktoken_pattern, tokenizer_vocab_size, tiktoken_num_special_tokens,
                                tokenizer_special_tokens)
        try:
            import tiktoken
        except ImportError:
            raise UserInputError("--tokenizer-type TikTokenizer needs the tiktoken package: "
                                 "pip install 'megatron-zaya[tiktoken]' (or pip install tiktoken)") from None
        self.model_path = str(path)
        self._vocab_size = DEFAULT_VOCAB_SIZE if tokenizer_vocab_size is None else int(tokenizer_vocab_size)
        num_special = DEFAULT_NUM_SPECIAL_TOKENS if tiktoken_num_special_tokens is None else int(tiktoken_num_special_tokens)
        given = list(REQUIRED_SPECIAL_TOKENS if tokenizer_special_tokens is None else tokenizer_special_tokens)
        specials = given + [f"<SPECIAL_{k}>" for k in range(len(given), num_special)]
        self.special_tokens = {token: i for i, token in enumerate(specials)}
        ranks = load_tiktoken_ranks(self.model_path, self._vocab_size - num_special)
        self.pattern_name = tiktoken_pattern
        self.mergeable_ranks = {token: rank + num_special for token, rank in ranks.items()}   # token bytes -> id
        self._encoding = tiktoken.Encoding(
            name=os.path.basename(self.model_path),
            pat_str=TIKTOKEN_PATTERNS[tiktoken_pattern],
            mergeable_ranks=self.mergeable_ranks,
            special_tokens=self.special_tokens,
        )
        self.unk = self.special_tokens["<unk>"]
        self._bos = self.special_tokens["<s>"]
        self._eod = self.special_tokens["</s>"]
        self._pad = None

    def encode(self, text: str) -> list[int]:
        return self._encoding.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._encoding.encode_ordinary_batch(list(texts))

    def decode(self, ids: Sequence[int]) -> str:
        return self._encoding.decode(_to_int_list(ids), errors="replace")
