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
- GPTSentencePieceTokenizer, Llama2Tokenizer (BOS in front): a tokenizer.json written from the model
  file's own settings (_sentencepiece_json), not by transformers' conversion, which changes the ids
  of repeated spaces and newlines and decodes byte-fallback pieces as text like "<0x48>". BPE models
  with byte fallback, normalized as our trainer's or Llama's; others are refused with the reason.
For the last four `split_special_tokens` is set, as our encoders treat special-token text as text.
SentencePieceTokenizer (special tokens matched in text, decoded with spaces around them) and
NullTokenizer have no exact form and are refused.
"""
from __future__ import annotations

import json
import os

from megatron_zaya.data.tokenizer_sentencepiece import SENTENCEPIECE_BPE, sentencepiece_proto
from megatron_zaya.errors import UserInputError

NO_EXACT_FORM = {
    "SentencePieceTokenizer": "its special tokens are matched in text and decoded with spaces around them, which a "
                              "Hugging Face tokenizer does not reproduce",
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
    pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TIKTOKEN_PATTERNS[tokenizer.pattern_name]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    # tiktoken takes a piece that is a token whole, before any merge (a vocabulary trained elsewhere can hold
    # tokens its pairwise merges never reach): ignore_merges does the same. Not when a special token is a
    # whole piece itself: its text would then read as the special token.
    special_pieces = [t for t in tokenizer.special_tokens if len(pre_tokenizer.pre_tokenize_str(t)) == 1]
    bpe = models.BPE(vocab=vocab, merges=[(a, b) for *_, a, b in merges], ignore_merges=not special_pieces)
    hf = Tokenizer(bpe)
    hf.pre_tokenizer = pre_tokenizer
    hf.decoder = decoders.ByteLevel()
    specials = sorted(tokenizer.special_tokens.items(), key=lambda item: item[1])
    hf.add_special_tokens([AddedToken(token, special=True, normalized=False) for token, _ in specials])
    return hf.to_str()


# SentencePiece piece types (sentencepiece_model.proto)
_SP_NORMAL, _SP_UNKNOWN, _SP_CONTROL, _SP_USER_DEFINED = 1, 2, 3, 4
_MANY = 1 << 30


# (normalization rule, remove_extra_whitespaces) of the SentencePiece models this converter reproduces
# exactly (tested): the trainer's default and Llama-style models' (no normalization, spaces kept).
_SP_NORMALIZATIONS = (("nmt_nfkc", True), ("identity", False))


def _sentencepiece_unsupported(model) -> str | None:
    """Why a SentencePiece model has no exact tokenizer.json here (None: it has one)."""
    trainer = model.trainer_spec
    if trainer.model_type != SENTENCEPIECE_BPE:
        return "only BPE models are converted (a unigram model's ties between equally likely splits break differently)"
    if not trainer.byte_fallback:
        return ("it has no byte fallback (SentencePiece decodes an unknown piece as ' \u2047 ', which no Hugging Face "
                "decoder reproduces; retrain without --no-byte-fallback)")
    if any(p.type == _SP_USER_DEFINED for p in model.pieces):
        return ("it has user-defined symbols (SentencePiece matches them after its dummy prefix, which a Hugging Face "
                "tokenizer cannot reproduce)")
    spec = model.normalizer_spec
    custom_denormalizer = bool(model.denormalizer_spec.precompiled_charsmap)
    if (spec.name, spec.remove_extra_whitespaces) not in _SP_NORMALIZATIONS or custom_denormalizer:
        return (f"its normalization (rule {spec.name!r}, remove_extra_whitespaces {spec.remove_extra_whitespaces}) is "
                f"not one of {', '.join(f'{name!r} with {flag}' for name, flag in _SP_NORMALIZATIONS)}")
    if not spec.escape_whitespaces:
        return "it does not write spaces as U+2581 (escape_whitespaces), which this converter does not reproduce"
    for option in ("treat_whitespace_as_suffix", "split_digits", "allow_whitespace_only_pieces"):
        if getattr(trainer, option):
            return f"it was trained with {option}, which this converter does not reproduce"
    return None


def _sentencepiece_json(tokenizer, bos: bool) -> str:
    """tokenizer.json of a SentencePiece BPE model: its normalizer (the precompiled character map, the
    removal of extra spaces, the dummy prefix, spaces as U+2581), the split into words at U+2581, its
    BPE (merges: every split of a piece into two normal pieces, ordered by the piece's score, as
    SentencePiece merges the best-scored pair first) with byte fallback, and SentencePiece's decoding.
    Control pieces and <unk> are special tokens (SentencePiece never makes them from text;
    split_special_tokens keeps it so; decode with skip_special_tokens=True drops them, as SentencePiece
    does). `bos`: a BOS in front of every text (Llama2Tokenizer). Models this cannot reproduce exactly
    are refused with the reason (_sentencepiece_unsupported)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    model = _exportable_sentencepiece_model(tokenizer)
    pieces = model.pieces
    unk_id = next(i for i, p in enumerate(pieces) if p.type == _SP_UNKNOWN)
    vocab = {p.piece: i for i, p in enumerate(pieces)}
    mergeable = {p.piece for p in pieces if p.type == _SP_NORMAL}
    merges = sorted((-p.score, i, vocab[p.piece[:cut]], vocab[p.piece[cut:]], p.piece[:cut], p.piece[cut:])
                    for i, p in enumerate(pieces) if p.type == _SP_NORMAL
                    for cut in range(1, len(p.piece))
                    if p.piece[:cut] in mergeable and p.piece[cut:] in mergeable)
    hf = Tokenizer(models.BPE(vocab=vocab, merges=[(a, b) for *_, a, b in merges], unk_token=pieces[unk_id].piece,
                              byte_fallback=True, fuse_unk=True))
    spec = model.normalizer_spec
    # NFKC before the character map: tokenizers' Precompiled takes the shortest rule where SentencePiece takes
    # the longest (huggingface/tokenizers#2116), which lost decomposed accents ("Vie\u0323\u0302t" -> "Viẹt").
    # Composed first, the map sees single characters. Left different: a combining mark after a ligature or
    # a virama, or after U+2581 (docs/CHECKPOINTING.md).
    steps = [normalizers.NFKC(), normalizers.Precompiled(spec.precompiled_charsmap)] \
        if spec.precompiled_charsmap else []
    if spec.remove_extra_whitespaces:     # of spaces only (after the character map), as SentencePiece does
        steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Replace(Regex("\\A | \\z"), "")]
    if spec.add_dummy_prefix:             # always, as SentencePiece (Metaspace skips a text starting with U+2581)
        steps.append(normalizers.Prepend("\u2581"))
    steps.append(normalizers.Replace(" ", "\u2581"))
    hf.normalizer = normalizers.Sequence(steps)
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", split=model.trainer_spec.split_by_whitespace,
                                                prepend_scheme="never")
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if spec.remove_extra_whitespaces:     # SentencePiece's decoding drops every leading space then
        steps.append(decoders.Strip(" ", _MANY, 0))
    elif spec.add_dummy_prefix:           # and otherwise the dummy prefix's one
        steps.append(decoders.Strip(" ", 1, 0))
    hf.decoder = decoders.Sequence(steps)
    hf.add_special_tokens([AddedToken(p.piece, special=True, normalized=False) for p in pieces
                           if p.type in (_SP_CONTROL, _SP_UNKNOWN)])
    if bos:
        bos_piece = pieces[tokenizer.bos].piece
        hf.post_processor = processors.TemplateProcessing(single=f"{bos_piece} $A",
                                                          special_tokens=[(bos_piece, tokenizer.bos)])
    return hf.to_str()


def sentencepiece_export_problem(processor) -> str | None:
    """Why a loaded SentencePiece model (a SentencePieceProcessor) has no exact Hugging Face tokenizer
    here, or None (tools/train_tokenizer.py says so as soon as it has trained one)."""
    return _sentencepiece_unsupported(sentencepiece_proto(processor))


def _exportable_sentencepiece_model(tokenizer):
    """The tokenizer's SentencePiece ModelProto, or UserInputError naming the file and the reason."""
    model = sentencepiece_proto(tokenizer.sp)
    why = _sentencepiece_unsupported(model)
    if why:
        raise UserInputError(f"--tokenizer-model {tokenizer.model_path}: no exact Hugging Face form of this "
                             f"SentencePiece model: {why}; convert without the tokenizer flags")
    return model


def check_exportable(kind: str, tokenizer=None) -> None:
    """UserInputError for a --tokenizer-type without an exact Hugging Face form, or (given the built
    tokenizer) a SentencePiece model without one: cheap, before a checkpoint is read."""
    if kind in NO_EXACT_FORM:
        raise UserInputError(f"--tokenizer-type {kind}: no Hugging Face tokenizer gives the same ids "
                             f"({NO_EXACT_FORM[kind]}); convert without the tokenizer flags")
    if tokenizer is not None and kind in ("GPTSentencePieceTokenizer", "Llama2Tokenizer"):
        _exportable_sentencepiece_model(tokenizer)


def hf_tokenizer_files(tokenizer) -> dict[str, str]:
    """{file name: text} to write into the Hugging Face folder."""
    kind = tokenizer.name
    check_exportable(kind)
    if kind == "HuggingFaceTokenizer":
        folder = os.path.dirname(tokenizer.model_path)
        files = {"tokenizer.json": open(tokenizer.model_path, encoding="utf-8").read()}
        for name in ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "chat_template.json"):
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
    elif kind in ("GPTSentencePieceTokenizer", "Llama2Tokenizer"):
        body = _sentencepiece_json(tokenizer, bos=kind == "Llama2Tokenizer")
        sp = tokenizer.sp
        names = {f"{role}_token": sp.IdToPiece(token_id) for role, token_id in
                 (("eos", sp.eos_id()), ("bos", sp.bos_id()), ("unk", sp.unk_id()), ("pad", sp.pad_id()))
                 if token_id >= 0}
    else:
        raise UserInputError(f"--tokenizer-type {kind}: no Hugging Face export for this tokenizer type")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **names, "split_special_tokens": True,
              "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False}
    return {"tokenizer.json": body, "tokenizer_config.json": json.dumps(config, indent=2) + "\n"}


def hf_token_ids(tokenizer) -> dict[str, int | None]:
    """config.json's special token ids (generation stops at eos_token_id); None (null) for one the
    tokenizer lacks, as SentencePiece's -1 means."""
    ids = {"eos_token_id": tokenizer.eod, "bos_token_id": tokenizer.bos, "pad_token_id": tokenizer.pad}
    return {name: int(value) if value is not None and value >= 0 else None for name, value in ids.items()}


def hf_generation_config(token_ids: dict, vocab_size: int, padded_vocab_size: int) -> dict:
    """generation_config.json: the special ids (hf_token_ids), and the padded vocabulary's rows beyond the
    tokenizer's `vocab_size` (`--make-vocab-size-divisible-by`) suppressed, as our own sampling leaves them out
    (`vocab_limit`), so that transformers' generate() never draws an id the tokenizer cannot decode."""
    return {**token_ids, "suppress_tokens": list(range(vocab_size, padded_vocab_size))}
