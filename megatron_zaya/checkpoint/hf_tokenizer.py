"""The tokenizer of a Hugging Face export (tools/convert_checkpoint.py to-hf --tokenizer-type ...):
files that `transformers.AutoTokenizer.from_pretrained(folder)` loads into a tokenizer giving the
same ids as ours, and the special token ids for config.json.

- HuggingFaceTokenizer: its own tokenizer.json, with tokenizer_config.json and
  special_tokens_map.json when they sit beside it (transformers' loading of that folder is what
  HuggingFaceTokenizer matches); without a tokenizer_config.json one is written that loads the
  tokenizer.json as it is (else transformers would pick a tokenizer class from config.json's
  model type and rebuild its normaliser and pre-tokenizer);
- GPT2BPETokenizer: the byte-level BPE as a tokenizer.json (`tokenizers` serialises it);
- TikTokenizer: a tokenizer.json built from the ranks: the tiktoken pattern split, byte-level BPE
  whose merges are every split of a token into two tokens, ordered by the token's rank (so the
  lowest-ranked pair merges first, as in tiktoken), and the special tokens at their ids.
For the last two `split_special_tokens` is set, as our encoders treat special-token text as text.
SentencePiece types have no exact form: transformers' conversion to tokenizer.json normalises
whitespace differently (repeated spaces, newlines), and its SentencePiece backend decodes
byte-fallback pieces as text like "<0x48>"; they are refused, as NullTokenizer is.
"""
from __future__ import annotations

import json
import os

from megatron_zaya.errors import UserInputError

NO_EXACT_FORM = {
    "GPTSentencePieceTokenizer": "transformers' SentencePiece conversion changes the ids of repeated spaces and "
                                 "newlines, and its SentencePiece backend decodes byte-fallback pieces as '<0xNN>'",
    "SentencePieceTokenizer": "see GPTSentencePieceTokenizer",
    "Llama2Tokenizer": "see GPTSentencePieceTokenizer",
    "NullTokenizer": "it reads integer ids, not text",
}


def _byte_level(token: bytes, symbols: dict[int, str]) -> str:
    return "".join(symbols[b] for b in token)


def _tiktoken_json(tokenizer) -> str:
    """tokenizer.json of a TikTokenizer (see the module docstring)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    from megatron_zaya.data.tokenizer_hf import _bytes_to_symbols
    from megatron_zaya.data.tokenizer_tiktoken import TIKTOKEN_PATTERNS
    symbols = _bytes_to_symbols()
    ranks = tokenizer.mergeable_ranks          # token bytes -> id (ranks shifted past the special tokens)
    vocab = {_byte_level(token, symbols): token_id for token, token_id in ranks.items()}
    clash = sorted(set(vocab) & set(tokenizer.special_tokens))
    if clash:       # a learned token spelled like a special one: one string cannot name both ids
        raise UserInputError(f"--tokenizer-model {tokenizer.model_path}: the token {clash[0]!r} is both a special "
                             f"token and a learned one; a Hugging Face tokenizer cannot hold both")
    vocab.update(tokenizer.special_tokens)        # at their own ids, before the ranks
    merges = []
    for token, token_id in sorted(ranks.items(), key=lambda item: item[1]):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                merges.append((token_id, ranks[left], ranks[right], _byte_level(left, symbols), _byte_level(right, symbols)))
    merges.sort()
    bpe = models.BPE(vocab=vocab, merges=[(a, b) for *_, a, b in merges], ignore_merges=False)
    hf = Tokenizer(bpe)
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TIKTOKEN_PATTERNS[tokenizer.pattern_name]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    hf.decoder = decoders.ByteLevel()
    specials = sorted(tokenizer.special_tokens.items(), key=lambda item: item[1])
    hf.add_special_tokens([AddedToken(token, special=True, normalized=False) for token, _ in specials])
    return hf.to_str()


def check_exportable(kind: str) -> None:
    """UserInputError for a --tokenizer-type without an exact Hugging Face form."""
    if kind in NO_EXACT_FORM:
        raise UserInputError(f"--tokenizer-type {kind}: no Hugging Face tokenizer gives the same ids "
                             f"({NO_EXACT_FORM[kind]}); convert without the tokenizer flags")


def hf_tokenizer_files(tokenizer) -> dict[str, str]:
    """{file name: text} to write into the Hugging Face folder."""
    kind = tokenizer.name
    check_exportable(kind)
    if kind == "HuggingFaceTokenizer":
        folder = os.path.dirname(tokenizer.model_path)
        files = {"tokenizer.json": open(tokenizer.model_path, encoding="utf-8").read()}
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                files[name] = open(path, encoding="utf-8").read()
        if "tokenizer_config.json" not in files:
            names = {f"{role}_token": tokenizer.tok.id_to_token(token_id)
                     for role, token_id in (("eos", tokenizer.eod), ("bos", tokenizer.bos), ("pad", tokenizer.pad))
                     if token_id is not None}
            config = {"tokenizer_class": "PreTrainedTokenizerFast", **names, "clean_up_tokenization_spaces": False}
            files["tokenizer_config.json"] = json.dumps(config, indent=2) + "\n"
        return files
    if kind == "GPT2BPETokenizer":
        body = tokenizer.tok.to_str()
        names = {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
    elif kind == "TikTokenizer":
        body = _tiktoken_json(tokenizer)
        names = {"eos_token": "</s>", "bos_token": "<s>", "unk_token": "<unk>"}
    else:
        raise UserInputError(f"--tokenizer-type {kind}: no Hugging Face export for this tokenizer type")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **names, "split_special_tokens": True,
              "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False}
    return {"tokenizer.json": body, "tokenizer_config.json": json.dumps(config, indent=2) + "\n"}


def hf_token_ids(tokenizer) -> dict[str, int]:
    """config.json's special token ids (generation stops at eos_token_id)."""
    ids = {"eos_token_id": tokenizer.eod, "bos_token_id": tokenizer.bos, "pad_token_id": tokenizer.pad}
    return {name: int(value) for name, value in ids.items() if value is not None}
