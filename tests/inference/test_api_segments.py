"""/api's "segments" on byte-level tokenizers (token id = one byte): a character split over several byte
tokens is the text of the last of them and every other token keeps its own text, so that the segments join
to the text (docs/INFERENCE.md), also where the text keeps U+FFFD (bytes never completed, or U+FFFD itself
in the prompt). Two decoders: Python's (one U+FFFD per cut sequence) and SentencePiece's byte fallback (one
per byte: a first version cut the text by prefix lengths alone and gave the bytes the next tokens' text)."""
import codecs
import random

import pytest

from megatron_zaya.inference.server import GenerationRequest, TextGenerationService
from megatron_zaya.inference.text_offsets import token_texts

from inference_helpers import one_cpu_thread, tiny_model  # noqa: F401 (fixtures)


class ByteTokenizer:
    eod, bos, vocab_size = None, None, 256

    def encode(self, text):
        return list(text.encode("utf-8"))

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


codecs.register_error("fffd_per_byte", lambda err: ("\ufffd" * (err.end - err.start), err.end))


def per_byte_decode(ids):
    """As SentencePiece's byte fallback decodes: one U+FFFD per byte it cannot place."""
    return bytes(ids).decode("utf-8", errors="fffd_per_byte")


def test_segments_of_characters_split_over_byte_tokens_join_to_the_text(tiny_model):
    prompt = "h\u00e9llo \U0001f600 x"                 # é: 2 bytes, the emoji 4
    answer = TextGenerationService(tiny_model, ByteTokenizer()).respond(
        GenerationRequest([prompt], tokens_to_generate=3, top_k=1))
    segments, text = answer["segments"][0], answer["text"][0]
    assert segments[:13] == ["h", "", "\u00e9", "l", "l", "o", " ", "", "", "", "\U0001f600", " ", "x"]
    assert "".join(segments) == text and text.startswith(prompt)


@pytest.mark.parametrize("decode", [ByteTokenizer().decode, per_byte_decode], ids=["python", "per-byte"])
def test_every_token_keeps_its_own_text_and_a_split_character_goes_to_its_last_byte(decode):
    """300 random texts of 1 to 120 characters (ASCII, 2- to 4-byte characters, U+FFFD itself), one token per
    byte: prefix_text_lengths decodes each prefix below 64 tokens, and by windows above."""
    assert token_texts(decode, list("a \U0001f600 k".encode())) == ["a", " ", "", "", "", "\U0001f600", " ", "k"]
    rng = random.Random(0)
    chars = ["a", "b", " ", "\u00e9", "\u20ac", "\u2a40", "\U0001f600", "\ufffd"]
    for n in [rng.randint(1, 120) for _ in range(300)]:
        text = "".join(rng.choice(chars) for _ in range(n))
        ids = list(text.encode())
        texts = token_texts(decode, ids)
        assert "".join(texts) == text
        assert all(texts[k] == chr(t) for k, t in enumerate(ids) if t < 0x80), text
        if "\ufffd" not in text:            # (U+FFFD's first byte already decodes to the character it is)
            assert texts == [part for c in text for part in [""] * (len(c.encode()) - 1) + [c]], text


@pytest.mark.parametrize("decode", [ByteTokenizer().decode, per_byte_decode], ids=["python", "per-byte"])
def test_bytes_that_never_make_a_character_stay_in_the_text(decode):
    """Invalid bytes (a model's byte tokens in any order) decode to U+FFFD that stays in the text: the segments
    join to it. (With SentencePiece's one U+FFFD per byte, a byte that a later one turns invalid cannot be told
    from a U+FFFD the text holds, so which of two neighbours holds it may differ; the text does not.)"""
    assert token_texts(decode, [0xC3, 0x41]) == ["\ufffd", "A"]
    rng = random.Random(0)
    pool = list(b"ab \xc3\xa9\xf0\x9f\x98\x80\xef\xbf\xbd\xe2\x82\xac\x80\xbf\xff")
    for n in [rng.randint(1, 300) for _ in range(300)]:
        ids = [rng.choice(pool) for _ in range(n)]
        assert "".join(token_texts(decode, ids)) == decode(ids), bytes(ids)
    if decode is not per_byte_decode:
        assert token_texts(decode, list("\ufffd\ufffd".encode())) == ["\ufffd", "", "", "\ufffd", "", ""]
