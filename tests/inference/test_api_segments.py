"""/api's "segments" on a byte-level tokenizer (token id = one byte): a character split over several byte
tokens is the text of the first of them, so that the segments join to the text (docs/INFERENCE.md), also
where the text keeps U+FFFD (bytes never completed, or U+FFFD itself in the prompt)."""
import random

from megatron_zaya.inference.server import GenerationRequest, TextGenerationService
from megatron_zaya.inference.text_offsets import token_texts

from inference_helpers import one_cpu_thread, tiny_model  # noqa: F401 (fixtures)


class ByteTokenizer:
    eod, bos, vocab_size = None, None, 256

    def encode(self, text):
        return list(text.encode("utf-8"))

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


def test_segments_of_characters_split_over_byte_tokens_join_to_the_text(tiny_model):
    prompt = "h\u00e9llo \U0001f600 x"                 # é: 2 bytes, the emoji 4
    answer = TextGenerationService(tiny_model, ByteTokenizer()).respond(
        GenerationRequest([prompt], tokens_to_generate=3, top_k=1))
    segments, text = answer["segments"][0], answer["text"][0]
    assert segments[:13] == ["h", "\u00e9", "", "l", "l", "o", " ", "\U0001f600", "", "", "", " ", "x"]
    assert "".join(segments) == text and text.startswith(prompt)


def test_a_replacement_character_that_stays_in_the_text_is_kept():
    """Invalid bytes never completed, and runs of U+FFFD in the text itself (mojibake in web text), stay in the
    joined segments: 300 random byte strings of 1 to 300 tokens (prefix_text_lengths decodes each prefix below
    64 tokens, and by windows above) against decode(ids) itself."""
    decode = ByteTokenizer().decode
    assert token_texts(decode, [0xC3, 0x41]) == ["\ufffd", "A"]
    assert token_texts(decode, list("\ufffd\ufffd\ufffd".encode())) == ["\ufffd", "", "", "\ufffd", "", "",
                                                                        "\ufffd", "", ""]
    rng = random.Random(0)
    pool = list(b"ab \xc3\xa9\xf0\x9f\x98\x80\xef\xbf\xbd\xe2\x82\xac\x80\xbf\xff")
    for n in [rng.randint(1, 300) for _ in range(300)]:
        ids = [rng.choice(pool) for _ in range(n)]
        assert "".join(token_texts(decode, ids)) == decode(ids), bytes(ids)
