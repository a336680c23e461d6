"""/api's "segments" on a byte-level tokenizer (token id = one byte): a character split over several byte
tokens is the text of the last of them, so that the segments join to the text (docs/INFERENCE.md)."""
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
    assert segments[:13] == ["h", "", "\u00e9", "l", "l", "o", " ", "", "", "", "\U0001f600", " ", "x"]
    assert "".join(segments) == text and text.startswith(prompt)


def test_a_replacement_character_that_stays_in_the_text_is_kept():
    """An invalid byte never completed (U+FFFD in the text) goes with the token after it, or the last token."""
    decode = ByteTokenizer().decode
    for ids in ([0xC3, 0x41], [0x41, 0xC3], [0xF0, 0x9F, 0x98]):
        assert "".join(token_texts(decode, ids)) == decode(ids)
    assert token_texts(decode, [0xC3, 0x41]) == ["", "\ufffdA"]
