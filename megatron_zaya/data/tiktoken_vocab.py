"""Train and write TikTokenizer vocabularies (tools/train_tokenizer.py --model-type tiktoken).

`train_tiktoken_ranks(lines, num_ranks, pattern)` learns a byte-level BPE with the `tokenizers`
package: text is split by one of Megatron's tiktoken patterns (as TikTokenizer splits it), then
merges are learned over bytes. Rank r < 256 is the byte r; rank 256 + k is the token made by the
k-th merge, so merging the lowest-ranked pair first (what tiktoken does) replays the merges in the
order they were learned. `write_tiktoken_vocab(tokens, path)` writes Megatron's JSON list of
{rank, token_bytes (base64), token_str}.
"""

from __future__ import annotations

import base64
import json
from typing import Iterable

from .tokenizer_hf import _bytes_to_symbols
from .tokenizer_tiktoken import TIKTOKEN_PATTERNS


def train_tiktoken_ranks(lines: Iterable[str], num_ranks: int, pattern: str = "v2",
                         min_frequency: int = 2) -> list[bytes]:
    """Token bytes by rank (at most `num_ranks`, the 256 single bytes first) learned from `lines`."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    if num_ranks < 256:
        raise ValueError(f"a TikTokenizer vocabulary holds at least the 256 byte tokens, got {num_ranks}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TIKTOKEN_PATTERNS[pattern]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=num_ranks, min_frequency=min_frequency, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tokenizer.train_from_iterator(lines, trainer)
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    to_byte = {symbol: byte for byte, symbol in _bytes_to_symbols().items()}
    tokens = [bytes([b]) for b in range(256)]
    for merge in merges[:num_ranks - 256]:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        tokens.append(bytes(to_byte[c] for c in left + right))
    return tokens


def write_tiktoken_vocab(tokens: list[bytes], path: str) -> None:
    """Megatron's TikTokenizer JSON: entry i = {rank: i, token_bytes: base64, token_str: text or ""}."""
    entries = []
    for rank, token in enumerate(tokens):
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            text = ""
        entries.append({"rank": rank, "token_bytes": base64.b64encode(token).decode("ascii"), "token_str": text})
    with open(path, "w", encoding="utf-8") as f:
        json.dump(entries, f, ensure_ascii=False)
