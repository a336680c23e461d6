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


def test_a_token_held_back_as_a_possible_stop_sends_its_logprob_only_once_kept():
    """The log-probabilities of a token whose text is held back (it may begin a stop string) wait with it:
    the stop "p " then drops "p", and the chunks' tokens are those the unstreamed answer keeps ("a")."""
    choice = ChoiceStream(BYTES, list(b"> "), 0, ("p ",), 0)
    chunks = []
    for token in b"ap ":
        chunks += choice.add(token, None, -0.5, None)
    assert choice.finish_reason == "stop" and "".join(c["text"] for c in chunks) == "a"
    assert [t for c in chunks for t in c["logprobs"]["tokens"]] == ["a"]
    assert [o for c in chunks for o in c["logprobs"]["text_offset"]] == [2]
    # without a stop, every token's log-probability is sent, each once, in order
    choice = ChoiceStream(BYTES, list(b"> "), 0, ("p ",), 0)
    chunks = [c for token in b"apex" for c in choice.add(token, None, -0.5, None)] + choice.finish("length")
    assert [t for c in chunks for t in c["logprobs"]["tokens"]] == list("apex")
    assert [o for c in chunks for o in c["logprobs"]["text_offset"]] == [2, 3, 4, 5]


def test_top_logprobs_keep_every_text_once_the_larger_value_first_and_the_sampled_token():
    """completions.scored_token: alternatives by their text at their place, most likely first; two ids with one
    text (e.g. byte-fallback pieces, or the same piece twice in a vocabulary) keep the larger value; a sampled
    token outside the top is added (OpenAI: up to logprobs + 1 entries). Pieces with SentencePiece's rule: the
    leading space of the text's first piece is dropped."""
    from megatron_zaya.inference.completions import scored_token
    pieces = {1: " the", 2: " cat", 3: "s", 4: " cat", 5: " dog"}

    def decode(ids):
        return "".join(pieces[i] for i in ids).removeprefix(" ")
    text, top = scored_token(decode, [1], 2, -1.0, {4: -0.5, 2: -1.0, 3: -2.0})
    assert text == " cat" and list(top.items()) == [(" cat", -0.5), ("s", -2.0)]
    text, top = scored_token(decode, [1], 5, -3.0, {4: -0.5, 3: -2.0})
    assert text == " dog" and list(top.items()) == [(" cat", -0.5), ("s", -2.0), (" dog", -3.0)]
    assert scored_token(decode, [], 2, None, None) == ("cat", None)      # the text's first token
