"""inference.text_offsets at its edges, with decoders built for them: a byte-level decoder (token id = one byte,
U+FFFD for a character not yet complete), whose text for a byte depends on up to 3 bytes before it, and a
decoder whose text for a token depends on exactly the LEFT_CONTEXT-th token before it, the most the module
promises to handle exactly."""
from megatron_zaya.inference.text_offsets import (FREEZE_BLOCK, LEFT_CONTEXT, GrowingText, prefix_text_lengths,
                                                  texts_after)


def byte_decode(ids):
    return bytes(ids).decode("utf-8", errors="replace")


def far_decode(ids):
    """Token k reads as a letter of ids[k] + ids[k - LEFT_CONTEXT] (the latter 0 before the start)."""
    return "".join(chr(97 + (t + (ids[k - LEFT_CONTEXT] if k >= LEFT_CONTEXT else 0)) % 26)
                   for k, t in enumerate(ids))


def completion_text(decode, context, tokens):
    """decode(context + tokens) minus the context's text (the context's last LEFT_CONTEXT tokens)."""
    left = list(context)[-LEFT_CONTEXT:]
    whole, left_text = decode(left + list(tokens)), decode(left)
    return whole[len(left_text):] if whole.startswith(left_text) else decode(tokens)


def test_texts_after_a_character_split_over_tokens():
    """Each byte of text with 2-, 3- and 4-byte characters: where decode(ids[:k + 1]) extends decode(ids[:k]),
    the byte's text is that extension (empty inside a character: it only replaces the U+FFFD); where it does
    not (the character's last byte), the byte reads alone."""
    ids = list("a\u00e9b\u4e2dc\U0001f642d".encode())
    for k in range(1, len(ids)):
        before, after = byte_decode(ids[:k]), byte_decode(ids[:k + 1])
        want = after[len(before):] if after.startswith(before) else byte_decode([ids[k]])
        assert texts_after(byte_decode, ids[:k], [ids[k]]) == [want], k


def test_texts_after_reads_the_last_left_context_tokens():
    ids = [(7 * k) % 23 for k in range(40)]
    for k in range(LEFT_CONTEXT, len(ids)):
        assert texts_after(far_decode, ids[:k], [ids[k]]) == [far_decode(ids[:k + 1])[k:]], k


def test_growing_text_after_a_prompt_that_ends_inside_a_character():
    """The prompt ends with the first bytes of a character: the completion's text is what the unstreamed answer
    gives (decode of the whole minus the prompt's text, or the completion alone where that is not a prefix)."""
    prompt, rest = list("ok \U0001f642".encode())[:-2], list("\U0001f642".encode())[-2:] + list(b" and more")
    growing = GrowingText(byte_decode, prompt)
    for k, token in enumerate(rest, 1):
        assert growing.append(token) == completion_text(byte_decode, prompt, rest[:k]), k


def test_growing_text_freezes_with_a_decoder_local_to_left_context_tokens():
    """A decoder whose token text depends on the token LEFT_CONTEXT before it: the text stays exact and the
    window arithmetic holds, so GrowingText freezes (bounded decoding) instead of redecoding everything."""
    prompt = [3] * 20
    tokens = [(5 * k + 1) % 26 for k in range(4 * FREEZE_BLOCK)]
    growing = GrowingText(far_decode, prompt)
    for k, token in enumerate(tokens, 1):
        assert growing.append(token) == completion_text(far_decode, prompt, tokens[:k]), k
    assert growing.frozen_tokens >= 2 * FREEZE_BLOCK


def test_prefix_lengths_take_repeated_positions_and_far_local_decoders():
    """Positions need only not descend (a position twice gives its length twice), and with block windows the
    lengths are exact for a decoder local to LEFT_CONTEXT tokens."""
    ids = [(3 * k) % 26 for k in range(200)]
    positions = [0, 0] + list(range(1, 100)) + [100, 100] + list(range(101, 201))
    assert prefix_text_lengths(far_decode, ids, positions) == [len(far_decode(ids[:k])) for k in positions]
    text = list("\u00e9t\u00e9 ".encode()) * 30
    positions = range(0, len(text) + 1, 7)
    assert prefix_text_lengths(byte_decode, text, positions, block=5) == [len(byte_decode(text[:k])) for k in positions]
