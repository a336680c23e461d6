"""SentencePiece tokenizers with Megatron-LM's conventions: GPTSentencePieceTokenizer,
SentencePieceTokenizer and Llama2Tokenizer (see megatron_zaya/data/tokenizer.py for the list)."""

from __future__ import annotations

import itertools
import operator
import os
import re
from typing import Sequence

from megatron_zaya.errors import UserInputError

from .tokenizer_base import BaseTokenizer, _to_int_list, other_kind_hint

# Control characters that SentencePiece's normalizers delete or remap; texts containing any of them
# (or any non-ASCII character) always take the exact, unsplit encoding path.
_UNSAFE_FOR_WORD_CACHE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_PROBES = ("a b", "a\tb", "a\nb", "a\r\nb", "  a  b ", " ", "", "a\n\n b.", "x!!y 1234abc", "Don't, I'd", "(a)[b]{c}")


def _load_sentencepiece(model_path: str):
    import sentencepiece as spm

    hint = other_kind_hint(model_path, "SentencePiece")
    if not os.path.isfile(model_path):
        raise FileNotFoundError(f"--tokenizer-model {model_path}: SentencePiece model file not found{hint}")
    sp = spm.SentencePieceProcessor()
    try:
        sp.Load(model_path)
    except (OSError, RuntimeError) as e:
        raise UserInputError(f"--tokenizer-model {model_path}: not a valid SentencePiece model ({e}){hint}") from None
    return sp


SENTENCEPIECE_BPE = 2     # trainer_spec.model_type


def sentencepiece_proto(processor):
    """The ModelProto of a loaded SentencePieceProcessor (needs protobuf)."""
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(processor.serialized_model_proto())
    return model


def _is_bpe(sp) -> bool:
    """Whether a loaded SentencePiece model is a BPE model; False when that cannot be read (no protobuf)."""
    try:
        return sentencepiece_proto(sp).trainer_spec.model_type == SENTENCEPIECE_BPE
    except Exception:      # protobuf missing or a model it cannot read: no cache, plain SentencePiece
        return False


class _WordCachedSentencePiece:
    """Exact speed-up for SentencePiece on plain-ASCII text.

    When no vocabulary piece contains the whitespace symbol U+2581 except at its start, no piece
    spans two words; SentencePiece's BPE merges then encode an ASCII text as the concatenation of its
    whitespace-separated words' encodings, each with its leading U+2581. (Not a unigram model: its Viterbi
    breaks ties between equal-score splits by sums that depend on the text before the word.)
    Words are encoded once and memoized in a numpy table, and a batch is assembled with vectorized
    gathers. Enabled only if the model passes that vocabulary check and a set of whitespace probes
    (the normalizer collapses runs of spaces and maps tab/newline to spaces); a text that is not
    ASCII or holds other control characters is encoded whole, as usual.
    """

    _CACHE_LIMIT = 1 << 20

    def _setup_word_cache(self) -> None:
        sp = self.sp
        self._reset_word_cache()
        ok = _is_bpe(sp) and all("\u2581" not in sp.IdToPiece(i)[1:] for i in range(sp.GetPieceSize()))
        self._word_cache_enabled = ok
        if ok:
            ok = all(self._encode_words(t) == sp.EncodeAsIds(t) for t in _PROBES)
        self._word_cache_enabled = ok
        self._reset_word_cache()

    def _reset_word_cache(self) -> None:
        import numpy as np

        self._wid: dict[str, int] = {}
        self._last_missed = True
        self._w_tokens = np.zeros(0, np.int32)
        self._w_start = np.zeros(0, np.int64)
        self._w_len = np.zeros(0, np.int64)

    def _add_words(self, words: list[str]) -> None:
        import numpy as np

        encoded = self.sp.Encode(words, num_threads=1)
        lens = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        flat = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int32, count=int(lens.sum()))
        base = len(self._wid)
        self._wid.update(zip(words, range(base, base + len(words))))
        starts = len(self._w_tokens) + np.concatenate(([0], np.cumsum(lens)[:-1])) if len(lens) else lens
        self._w_tokens = np.concatenate((self._w_tokens, flat))
        self._w_start = np.concatenate((self._w_start, starts))
        self._w_len = np.concatenate((self._w_len, lens))

    def _gather(self, words: list[str]):
        """Token array of a word sequence, plus the per-word token counts."""
        import numpy as np

        if not words:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        # While new words keep appearing (a cold cache), look for them first instead of failing a
        # full lookup; once the cache is warm, one lookup pass with no membership test.
        if self._last_missed:
            missing = set(words).difference(self._wid)
        else:
            try:
                ids = self._word_ids(words)
                missing = None
            except KeyError:
                missing = set(words).difference(self._wid)
        self._last_missed = bool(missing)
        if missing:
            if len(self._wid) + len(missing) > self._CACHE_LIMIT:
                self._reset_word_cache()  # bounded memory: start over with this batch's words
                missing = set(words)
            self._add_words(sorted(missing))
        if missing is not None:
            ids = self._word_ids(words)
        lens = self._w_len[ids]
        total = int(lens.sum())
        if total == 0:
            return np.zeros(0, np.int32), lens
        ends = np.cumsum(lens)
        idx = np.repeat(self._w_start[ids] - (ends - lens), lens) + np.arange(total)
        return self._w_tokens[idx], lens

    def _word_ids(self, words: list[str]):
        import numpy as np

        if len(words) == 1:
            return np.array([self._wid[words[0]]], dtype=np.int64)
        return np.array(operator.itemgetter(*words)(self._wid), dtype=np.int64)

    def _encode_words(self, text: str) -> list[int]:
        return self._gather(text.split())[0].tolist()

    def _word_safe(self, text: str) -> bool:
        return self._word_cache_enabled and text.isascii() and not _UNSAFE_FOR_WORD_CACHE.search(text)

    def encode_batch_flat(self, texts: Sequence[str]):
        """(tokens int32 array of all texts concatenated, per-text lengths int64 array)."""
        return self._encode_flat(texts)

    def _encode_flat(self, texts: Sequence[str]):
        """`encode_batch_flat` of the plain SentencePiece ids (what subclasses build on)."""
        import numpy as np

        texts = list(texts)
        pieces, lengths = [], np.zeros(len(texts), np.int64)
        i = 0
        while i < len(texts):
            j = i
            while j < len(texts) and self._word_safe(texts[j]):
                j += 1
            if j > i:  # a run of word-cacheable texts: one vectorized gather
                word_lists = [t.split() for t in texts[i:j]]
                counts = np.fromiter(map(len, word_lists), dtype=np.int64, count=j - i)
                toks, wl = self._gather(list(itertools.chain.from_iterable(word_lists)))
                cs = np.concatenate(([0], np.cumsum(wl)))
                bounds = np.concatenate(([0], np.cumsum(counts)))
                lengths[i:j] = cs[bounds[1:]] - cs[bounds[:-1]]
                pieces.append(toks)
                i = j
                continue
            ids = self._encode_one(texts[i])
            lengths[i] = len(ids)
            pieces.append(np.asarray(ids, dtype=np.int32))
            i += 1
        tokens = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
        return tokens, lengths

    def _encode_one(self, text: str) -> list[int]:
        return self.sp.EncodeAsIds(text)

    def _sp_encode_batch(self, texts: list[str]) -> list[list[int]]:
        if not self._word_cache_enabled:
            return self.sp.Encode(texts, num_threads=1)
        tokens, lengths = self._encode_flat(texts)
        out, pos = [], 0
        flat = tokens.tolist()
        for n in lengths.tolist():
            out.append(flat[pos:pos + n])
            pos += n
        return out


def _piece_id(piece: int) -> int | None:
    return piece if piece >= 0 else None


class GPTSentencePieceTokenizer(_WordCachedSentencePiece, BaseTokenizer):
    """SentencePiece ids as is; EOD = EOS (Megatron's GPTSentencePieceTokenizer)."""

    name = "GPTSentencePieceTokenizer"

    def __init__(self, model_path: str, **kw):
        super().__init__(**kw)
        self.model_path = model_path
        self.sp = _load_sentencepiece(model_path)
        self._vocab_size = self.sp.GetPieceSize()
        self._eod = self.sp.eos_id()
        self._bos = _piece_id(self.sp.bos_id())      # None where the model has none (SentencePiece says -1)
        self._pad = _piece_id(self.sp.pad_id())
        self.unk = self.sp.unk_id()
        if self._eod < 0:
            raise UserInputError(f"--tokenizer-model {model_path}: the SentencePiece model has no EOS piece, which GPTSentencePieceTokenizer uses as EOD")
        self._setup_word_cache()

    def encode(self, text: str) -> list[int]:
        return self.sp.EncodeAsIds(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp_encode_batch(list(texts))

    def decode(self, ids: Sequence[int]) -> str:
        return self.sp.DecodeIds(_to_int_list(ids))


class SentencePieceTokenizer(_WordCachedSentencePiece, BaseTokenizer):
    """Megatron's SentencePieceTokenizer: SentencePiece plus appended special tokens, EOD = <EOD>."""

    name = "SentencePieceTokenizer"

    def __init__(self, model_path: str, vocab_extra_ids: int = 0, **kw):
        super().__init__(**kw)
        self.model_path = model_path
        self.sp = _load_sentencepiece(model_path)
        self._vocab: dict[str, int] = {}
        for i in range(self.sp.GetPieceSize()):
            self._vocab[self.sp.IdToPiece(i)] = i
        self._special: dict[str, int] = {}  # insertion order matters for ties, as in Megatron

        def add(token: str) -> int:
            if token not in self._vocab:
                self._vocab[token] = len(self._vocab)
            self._special[token] = self._vocab[token]
            return self._vocab[token]

        self._cls = add("<CLS>")
        self._sep = add("<SEP>")
        self._eod = add("<EOD>")
        self._mask = add("<MASK>")
        self._pad = add(self._piece_or(self.sp.pad_id(), "<PAD>"))
        self._bos = add(self._piece_or(self.sp.bos_id(), "<BOS>"))
        self._eos = add(self._piece_or(self.sp.eos_id(), "<EOS>"))
        for i in range(vocab_extra_ids):
            add(f"<extra_id_{i}>")
        self._vocab_size = len(self._vocab)
        self._inv_special = {v: k for k, v in self._special.items()}
        self._setup_word_cache()

    def _piece_or(self, piece_id: int, default: str) -> str:
        if 0 <= piece_id < self.sp.GetPieceSize():
            return self.sp.IdToPiece(piece_id)
        return default

    @property
    def eos(self) -> int:
        return self._eos

    def _has_special(self, text: str) -> bool:
        return any(tok in text for tok in self._special)

    def _word_safe(self, text: str) -> bool:
        return super()._word_safe(text) and not self._has_special(text)

    def _encode_one(self, text: str) -> list[int]:
        return self.encode(text)

    def encode(self, text: str) -> list[int]:
        if not self._has_special(text):
            return self.sp.EncodeAsIds(text)
        ids: list[int] = []
        pos = 0
        while True:
            best_tok, best_at = None, -1
            for tok in self._special:  # earliest occurrence; first-registered wins a tie
                at = text.find(tok, pos)
                if at >= 0 and (best_tok is None or at < best_at):
                    best_tok, best_at = tok, at
            if best_tok is None:
                break
            ids.extend(self.sp.EncodeAsIds(text[pos:best_at]))
            ids.append(self._special[best_tok])
            pos = best_at + len(best_tok)
        ids.extend(self.sp.EncodeAsIds(text[pos:]))
        return ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        texts = list(texts)
        plain = [i for i, t in enumerate(texts) if not self._has_special(t)]
        out: list = [None] * len(texts)
        if plain:
            for i, ids in zip(plain, self._sp_encode_batch([texts[i] for i in plain])):
                out[i] = ids
        for i, t in enumerate(texts):
            if out[i] is None:
                out[i] = self.encode(t)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        ids = _to_int_list(ids)
        parts, start = [], 0
        for i, tid in enumerate(ids):
            if tid in self._inv_special:
                parts.append(self.sp.DecodeIds(ids[start:i]) + " " + self._inv_special[tid] + " ")
                start = i + 1
        parts.append(self.sp.DecodeIds(ids[start:]))
        return "".join(parts)


class Llama2Tokenizer(GPTSentencePieceTokenizer):
    """Megatron's Llama2Tokenizer: SentencePiece ids with the model's BOS in front of every text
    (`tokenize(s, bos=True, eos=False)`); EOD = EOS, the vocabulary is the model's pieces."""

    name = "Llama2Tokenizer"

    def __init__(self, model_path: str, **kw):
        super().__init__(model_path, **kw)
        if self._bos is None:
            raise UserInputError(f"--tokenizer-model {model_path}: the SentencePiece model has no BOS piece, which "
                                 f"Llama2Tokenizer puts in front of every text")

    def encode(self, text: str) -> list[int]:
        return [self._bos] + super().encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [[self._bos] + ids for ids in super().encode_batch(texts)]

    def encode_batch_flat(self, texts: Sequence[str]):
        import numpy as np

        tokens, lengths = self._encode_flat(texts)
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1])) if len(lengths) else lengths
        return np.insert(tokens, starts, self._bos).astype(np.int32, copy=False), lengths + 1
