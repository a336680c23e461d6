"""inference.streaming.ChoiceStream on a byte-level tokenizer (token id = one byte): the text it sends is
final text only, so a choice's chunks join to the text of all its tokens."""
from types import SimpleNamespace

from megatron_zaya.inference.streaming import ChoiceStream

BYTES = SimpleNamespace(decode=lambda ids: bytes(ids).decode("utf-8", errors="replace"))


def sent(choice, tokens, eod=None):
    chunks = []
    for token in tokens:
        chunks += choice.add(token, eod, None, None)
        if choice.finish_reason:
            break
    if not choice.finish_reason:
        chunks += choice.finish("length")
    return chunks


def test_a_character_split_over_tokens_waits_for_its_last_byte():
    tokens = list("caf\u00e9 ok".encode())                  # é is two tokens: 0xC3 0xA9
    chunks = sent(ChoiceStream(BYTES, list(b"> "), 0, (), None), tokens)
    assert [c["text"] for c in chunks] == ["c", "a", "f", "\u00e9", " ", "o", "k", ""]
    assert all("\ufffd" not in c["text"] for c in chunks) and chunks[-1]["finish_reason"] == "length"


def test_text_that_may_begin_a_stop_string_waits_and_the_stop_cuts_it():
    chunks = sent(ChoiceStream(BYTES, list(b"Q: "), 3, ("\nQ:",), None), list(b"yes\nno\nQ: next"))
    assert "".join(c["text"] for c in chunks) == "yes\nno" and chunks[-1]["finish_reason"] == "stop"
    assert all(c["index"] == 3 for c in chunks)
    # EOD ends the choice with what it has
    chunks = sent(ChoiceStream(BYTES, list(b"> "), 0, (), None), list(b"ab") + [0] + list(b"cd"), eod=0)
    assert "".join(c["text"] for c in chunks) == "ab" and chunks[-1]["finish_reason"] == "stop"
