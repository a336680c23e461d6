"""inference.text_offsets.prefix_text_lengths against decoding every prefix (OpenAI's text_offset), with
the tokenizers users train: SentencePiece with byte fallback, GPT-2 byte-level BPE, a Hugging Face
tokenizer.json. Text with multi-byte characters split across tokens, blocks forced small so that a
sequence spans many of them, and a decoder that is not local (the fallback must keep it exact).
GrowingText (a streamed completion's text) likewise against decoding the whole sequence at every token;
texts_after (one token's text at its place) against the difference of two prefixes' texts."""
import pytest

from megatron_zaya.data import build_tokenizer
from megatron_zaya.data.synthetic import TextGenerator
from megatron_zaya.inference.text_offsets import LEFT_CONTEXT, GrowingText, prefix_text_lengths, texts_after

TEXT = TextGenerator(seed=5, lexicon_size=3000).document(max_sentences=12) + \
    " Ünïcödé — 中文字符 and emoji 🙂🚀, tabs\tand  double  spaces. \"Quoted\" (parens) end."


def tokenizers(sp_model, gpt2_files, hf_tokenizer_dir):
    vocab, merges = gpt2_files
    return {
        "sentencepiece": build_tokenizer("GPTSentencePieceTokenizer", sp_model),
        "gpt2": build_tokenizer("GPT2BPETokenizer", None, vocab_file=str(vocab), merge_file=str(merges)),
        "huggingface": build_tokenizer("HuggingFaceTokenizer", str(hf_tokenizer_dir / "tokenizer.json")),
    }


@pytest.mark.parametrize("block", [None, 5, 32])
def test_equal_to_decoding_every_prefix(sp_model, gpt2_files, hf_tokenizer_dir, block):
    for name, tok in tokenizers(sp_model, gpt2_files, hf_tokenizer_dir).items():
        ids = tok.encode(TEXT)
        assert len(ids) > 100, name
        assert any(tok.decode([t]) not in TEXT for t in ids), f"{name}: no character split across tokens"
        for first in (0, 1, 37, len(ids) - 3, len(ids)):
            positions = range(first, len(ids) + 1) if first % 2 else range(first, len(ids))
            want = [len(tok.decode(ids[:k])) for k in positions]
            decoded = []

            def decode(part, _tok=tok):
                decoded.append(len(part))
                return _tok.decode(part)

            assert prefix_text_lengths(decode, ids, positions, block) == want, (name, first, block)
            if first == 0 and block != 5:   # by the windows, not by the fallback to every prefix
                assert sum(decoded) < sum(range(len(ids))) / 2, (name, block, sum(decoded))


def test_a_decoder_that_is_not_local_stays_exact():
    """A decode whose text grows with the whole sequence's length (k^2 characters for k tokens) misses
    every block end's exact prefix; each block then falls back to decoding its prefixes."""
    def decode(ids):
        return "x" * len(ids) ** 2

    ids = list(range(300))
    assert prefix_text_lengths(decode, ids, range(300), block=16) == [k * k for k in range(300)]


def test_decodes_far_fewer_tokens_than_every_prefix():
    """The point of it: the tokens decoded in all grow about as n^1.5, not n^2 (counted, not timed)."""
    decoded = []

    def decode(ids):
        decoded.append(len(ids))
        return "".join(chr(97 + t % 26) for t in ids)

    n = 4096
    ids = list(range(n))
    assert prefix_text_lengths(decode, ids, range(n)) == list(range(n))
    every_prefix = n * (n - 1) // 2
    assert sum(decoded) < every_prefix / 20, (sum(decoded), every_prefix)


def test_positions_must_ascend():
    with pytest.raises(ValueError, match="ascending"):
        prefix_text_lengths(lambda ids: "x" * len(ids), list(range(100)), [5, 3] + list(range(70)))


def text_after(decode, context, tokens):
    """The completion text by one whole decode: decode(context + tokens) minus the context's text."""
    left = list(context)[-LEFT_CONTEXT:]
    whole, left_text = decode(left + list(tokens)), decode(left)
    return whole[len(left_text):] if whole.startswith(left_text) else decode(tokens)


def test_growing_text_equals_decoding_the_whole_sequence(sp_model, gpt2_files, hf_tokenizer_dir):
    for name, tok in tokenizers(sp_model, gpt2_files, hf_tokenizer_dir).items():
        ids = tok.encode(TEXT + " " + TEXT + " " + TEXT)
        context, completion = ids[:30], ids[30:]
        assert len(completion) > 300, name            # several freezes of FREEZE_BLOCK tokens
        decoded = []

        def decode(part, _tok=tok):
            decoded.append(len(part))
            return _tok.decode(part)

        growing = GrowingText(decode, context)
        for k, token in enumerate(completion, 1):
            assert growing.append(token) == text_after(tok.decode, context, completion[:k]), (name, k)
        assert growing.frozen_tokens > 0, name
        assert sum(decoded) < len(completion) ** 2 / 8, (name, sum(decoded))


def test_growing_text_with_a_decoder_that_is_not_local_stays_exact():
    def decode(ids):            # its text grows with the whole sequence's length: no freeze holds
        return "x" * len(ids) ** 2

    growing = GrowingText(decode, [7] * 20)
    for k in range(1, 300):
        assert growing.append(k) == text_after(decode, [7] * 20, range(1, k + 1))
    assert growing.frozen_tokens == 0


def test_a_tokens_text_at_its_place_is_what_it_adds_to_the_text(sp_model, gpt2_files, hf_tokenizer_dir):
    """texts_after(ids[:k], [ids[k]]) == decode(ids[:k + 1]) minus decode(ids[:k]) for each token of whole
    characters (a piece of one split over tokens reads U+FFFD alone): SentencePiece's leading spaces, which
    decode([t]) drops, included; so the tokens of OpenAI's logprobs join to the text."""
    for name, tok in tokenizers(sp_model, gpt2_files, hf_tokenizer_dir).items():
        ids = tok.encode(TEXT)
        prefixes = [tok.decode(ids[:k]) for k in range(len(ids) + 1)]
        clean = [k for k in range(len(ids)) if "\ufffd" not in tok.decode([ids[k]])]    # whole characters
        assert len(clean) > 0.8 * len(ids), name
        for k in clean:
            assert texts_after(tok.decode, ids[:k], [ids[k]]) == [prefixes[k + 1][len(prefixes[k]):]], (name, k)
        if name == "sentencepiece":
            assert any(tok.decode([ids[k]]) != prefixes[k + 1][len(prefixes[k]):] for k in clean)   # a dropped space
