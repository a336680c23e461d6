"""Tokenizers run by the `tokenizers` package: HuggingFaceTokenizer (a local tokenizer.json) and
GPT2BPETokenizer (GPT-2's vocab.json + merges.txt). See megatron_zaya/data/tokenizer.py."""

from __future__ import annotations

import os
from typing import Sequence

from megatron_zaya.errors import UserInputError, hub_name_hint

from .tokenizer_base import BaseTokenizer, _load_json_object, _to_int_list, other_kind_hint

_EOS_CANDIDATES = ("<eos>", "</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "[SEP]")
_BOS_CANDIDATES = ("<bos>", "<s>", "<|begin_of_text|>", "<|startoftext|>", "[CLS]")
_PAD_CANDIDATES = ("<pad>", "[PAD]", "<|pad|>", "<|finetune_right_pad_id|>")


_SPECIAL_KEYS = ("eos_token", "bos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")
_TOKEN_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")


def _token_content(value) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return value.get("content")
    return None


def _declared_tokens(cfg: dict) -> list[tuple[str, object]]:
    """(key, token: a string or an AddedToken-like dict) of every token a tokenizer_config.json or
    special_tokens_map.json declares: the named special tokens, additional_special_tokens / extra_special_tokens
    (a list, or transformers 5's dict of names), and added_tokens_decoder's entries."""
    tokens = [(key, cfg[key]) for key in _SPECIAL_KEYS if cfg.get(key) is not None]
    for key in ("additional_special_tokens", "extra_special_tokens"):
        listed = cfg.get(key)
        tokens += [(key, t) for t in (listed.values() if isinstance(listed, dict) else listed or [])]
    added = cfg.get("added_tokens_decoder")
    tokens += [("added_tokens_decoder", t) for t in (added.values() if isinstance(added, dict) else [])]
    return [(key, t) for key, t in tokens if _token_content(t) is not None]


def _added_token(token, special_by_default: bool):
    """A tokenizers.AddedToken for a declared token, with the flags its entry gives (a bare string of a special
    token: special, not normalized, as transformers makes it)."""
    from tokenizers import AddedToken
    flags = {k: token[k] for k in _TOKEN_FLAGS if k in token} if isinstance(token, dict) else {}
    flags.setdefault("special", special_by_default)
    return AddedToken(_token_content(token), **flags)


class _TokenizersBackend(BaseTokenizer):
    """Encoding and decoding through a `tokenizers.Tokenizer` held in `self.tok`."""

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=True).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=True)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(_to_int_list(ids), skip_special_tokens=False)


def missing_tokenizer_json(path: str) -> str:
    """The error for a HuggingFaceTokenizer --tokenizer-model without a tokenizer.json (with a Hub name's hint)."""
    return (f"--tokenizer-model {path}: no tokenizer.json found (give the file or the directory holding it)"
            + hub_name_hint(path, "tokenizer.json tokenizer_config.json"))


class HuggingFaceTokenizer(_TokenizersBackend):
    """A local `tokenizer.json` via the `tokenizers` package (no hub access)."""

    name = "HuggingFaceTokenizer"

    def __init__(self, path: str, **kw):
        super().__init__(**kw)
        from tokenizers import Tokenizer

        if os.path.isdir(path):
            directory, json_path = path, os.path.join(path, "tokenizer.json")
        else:
            directory, json_path = os.path.dirname(path) or ".", path
        if not os.path.isfile(json_path):
            raise FileNotFoundError(missing_tokenizer_json(path))
        try:
            self.tok = Tokenizer.from_file(json_path)
        except Exception as e:  # the tokenizers package raises a generic Exception on bad files
            raise UserInputError(f"--tokenizer-model {json_path}: not a valid Hugging Face tokenizer.json, which "
                                 f"--tokenizer-type {self.name} reads ({e}){other_kind_hint(json_path, self.name)}"
                                 ) from None
        self.model_path = json_path
        self._vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        declared: dict[str, str] = {}
        registered = {t.content for t in self.tok.get_added_tokens_decoder().values()}
        # special_tokens_map.json wins where both declare one, as in transformers' AutoTokenizer (5.x)
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            p = os.path.join(directory, name)
            if os.path.isfile(p):
                cfg = _load_json_object(p)
                for key, token in _declared_tokens(cfg):
                    content = _token_content(token)
                    if key in ("eos_token", "bos_token", "pad_token", "unk_token"):
                        declared[key] = content
                    in_vocabulary = self.tok.token_to_id(content) is not None
                    if not in_vocabulary and key in ("eos_token", "bos_token", "pad_token", "added_tokens_decoder"):
                        # transformers would add it as a new token: other ids and vocabulary than Megatron's
                        raise UserInputError(
                            f"--tokenizer-model {json_path}: {p} declares the token {content!r} ({key}), which "
                            f"tokenizer.json does not hold (transformers adds it as id {self._vocab_size} or later; "
                            f"the ids would differ): add it to tokenizer.json's added_tokens")
                    if in_vocabulary and content not in registered:
                        # a vocabulary entry the config declares is one token wherever its text appears, as
                        # transformers registers it (it was encoded as its pieces)
                        added = _added_token(token, special_by_default=key != "added_tokens_decoder")
                        (self.tok.add_special_tokens if added.special else self.tok.add_tokens)([added])
                        registered.add(content)
                if cfg.get("split_special_tokens") is True:   # special-token text encoded as text, as transformers does
                    self.tok.encode_special_tokens = True
        self._eod = self._find("eos_token", declared, _EOS_CANDIDATES)
        self._bos = self._find("bos_token", declared, _BOS_CANDIDATES)
        self._pad = self._find("pad_token", declared, _PAD_CANDIDATES)
        # transformers' pad_token_id is the declared one only (a name-guessed pad still goes into an export)
        self.pad_declared = "pad_token" in declared
        self.unk = self._find("unk_token", declared, ("<unk>", "[UNK]"))
        if self._eod is None:
            raise UserInputError(
                f"--tokenizer-model {json_path}: cannot tell the EOS/EOD token; add a tokenizer_config.json "
                f"with \"eos_token\" beside it (none of {list(_EOS_CANDIDATES)} is in the vocabulary)"
            )

    def _find(self, key: str, declared: dict, candidates) -> int | None:
        if key in declared:
            tid = self.tok.token_to_id(declared[key])
            if tid is not None:
                return tid
        for c in candidates:
            tid = self.tok.token_to_id(c)
            if tid is not None:
                return tid
        return None


# Names a folder given as --tokenizer-model may use for GPT-2's two files: Hugging Face's, then Megatron's.
GPT2_FILE_NAMES = (("vocab.json", "merges.txt"), ("gpt2-vocab.json", "gpt2-merges.txt"))
GPT2_EOD_TOKEN = "<|endoftext|>"


def gpt2_bpe_files(tokenizer_model, vocab_file, merge_file) -> tuple[str, str]:
    """The (vocab.json, merges.txt) paths of a GPT2BPETokenizer: --vocab-file / --merge-file, each
    defaulting to the file of that kind in the folder --tokenizer-model. Raises `UserInputError`
    naming the flag when a file is missing."""
    folder = None if tokenizer_model is None else str(tokenizer_model)
    if folder is not None and not os.path.isdir(folder):
        raise UserInputError(f"--tokenizer-model {folder}: GPT2BPETokenizer takes a folder holding "
                             f"{' + '.join(GPT2_FILE_NAMES[0])} (or give --vocab-file and --merge-file)")
    found = []
    for flag, given, index in (("--vocab-file", vocab_file, 0), ("--merge-file", merge_file, 1)):
        if given is None:
            if folder is None:
                raise UserInputError(f"--tokenizer-type GPT2BPETokenizer needs {flag} (or --tokenizer-model with "
                                     f"a folder holding {' + '.join(GPT2_FILE_NAMES[0])})")
            names = [pair[index] for pair in GPT2_FILE_NAMES]
            given = next((os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))), None)
            if given is None:
                raise UserInputError(f"--tokenizer-model {folder}: none of {names} is in the folder (or give {flag})")
        elif not os.path.isfile(str(given)):
            raise UserInputError(f"{flag} {given}: file not found")
        found.append(str(given))
    return found[0], found[1]


def _bytes_to_symbols() -> dict[int, str]:
    """GPT-2's map from each byte to the printable character that stands for it in vocab.json:
    printable Latin-1 bytes map to themselves, the other 68 to U+0100 onwards, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
            *range(ord("\u00ae"), ord("\u00ff") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in kept:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class GPT2BPETokenizer(_TokenizersBackend):
    """Megatron's GPT2BPETokenizer: GPT-2's byte-level BPE; EOD = <|endoftext|>, no text is special."""

    name = "GPT2BPETokenizer"

    def __init__(self, tokenizer_model=None, vocab_file: str | None = None, merge_file: str | None = None, **kw):
        super().__init__(**kw)
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        vocab_file, merge_file = gpt2_bpe_files(tokenizer_model, vocab_file, merge_file)
        vocab = _load_json_object(vocab_file)
        bad = next((k for k, v in vocab.items() if not isinstance(v, int) or isinstance(v, bool)), None)
        if bad is not None:
            raise UserInputError(f"{vocab_file}: token {bad!r} maps to {vocab[bad]!r}, not an integer id")
        ids = sorted(vocab.values())
        if ids != list(range(len(ids))):
            raise UserInputError(f"{vocab_file}: the ids must be 0..{len(ids) - 1}, each once (GPT-2's vocab.json)")
        missing = [s for s in _bytes_to_symbols().values() if s not in vocab]
        if missing:
            raise UserInputError(f"{vocab_file}: not a byte-level BPE vocabulary: {len(missing)} of the 256 byte "
                                 f"symbols are missing (e.g. {missing[0]!r})")
        if GPT2_EOD_TOKEN not in vocab:
            raise UserInputError(f"{vocab_file}: no {GPT2_EOD_TOKEN} token, which GPT2BPETokenizer uses as EOD")
        try:
            bpe = models.BPE.from_file(vocab_file, merge_file)
        except Exception as e:  # the tokenizers package raises a generic Exception on bad files
            raise UserInputError(f"--merge-file {merge_file}: not GPT-2 merges for {vocab_file} ({e})") from None
        self.tok = Tokenizer(bpe)
        self.tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        self.tok.decoder = decoders.ByteLevel()
        self.vocab_file, self.merge_file = vocab_file, merge_file
        self.model_path = vocab_file
        self._vocab_size = len(vocab)
        self._eod = vocab[GPT2_EOD_TOKEN]
        self._bos = None
        self._pad = None
