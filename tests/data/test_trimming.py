"""Answer-preserving trimming of reasoning samples: every outcome, answers always kept verbatim."""

import pytest

from megatron_zaya.data.tokenizer import build_tokenizer
from megatron_zaya.data.trimming import ReasoningTrimmer, split_reasoning


def words_tokenizer():
    """A whitespace tokenizer (one token per word) so lengths are easy to reason about."""
    return (lambda t: t.split()), (lambda ids: " ".join(ids))


def make(max_length, extra=0):
    enc, dec = words_tokenizer()
    return ReasoningTrimmer(enc, dec, max_length, "<think>", "</think>", extra_tokens=extra)


R1 = " ".join(f"r1_{i}" for i in range(10))
R2 = " ".join(f"r2_{i}" for i in range(10))
SAMPLE = f"Q1 <think> {R1} </think> A1 Q2 <think> {R2} </think> A2 A2b"


def test_split_reasoning():
    segs = split_reasoning("a<t>b</t>c<t>d", "<t>", "</t>")
    assert [(s.text, s.reasoning) for s in segs] == [("a<t>", False), ("b", True), ("</t>c<t>", False), ("d", True), ("", False)]


def test_fit_is_untouched():
    ids, outcome = make(100)(SAMPLE)
    assert outcome == "fit" and ids == SAMPLE.split()


def test_trim_tail_of_last_block():
    total = len(SAMPLE.split())  # 31
    ids, outcome = make(total - 4)(SAMPLE)
    assert outcome == "trimmed_last_reasoning"
    assert len(ids) == total - 4
    assert ids[-3:] == ["</think>", "A2", "A2b"]
    kept_r2 = [t for t in ids if t.startswith("r2_")]
    assert kept_r2 == [f"r2_{i}" for i in range(6)]  # the head of the chain of thought survives
    assert [t for t in ids if t.startswith("r1_")] == R1.split()


def test_drop_earlier_reasoning():
    # plain tokens: Q1 <think> </think> A1 Q2 <think> </think> A2 A2b = 9; without block 1: 7
    ids, outcome = make(10)(SAMPLE)
    assert outcome == "dropped_earlier_reasoning"
    assert not any(t.startswith("r1_") for t in ids)
    assert ids == ["Q1", "A1", "Q2", "<think>", "r2_0", "r2_1", "r2_2", "</think>", "A2", "A2b"]


def test_answers_only_then_drop():
    ids, outcome = make(6)(SAMPLE)
    assert outcome == "answers_only" and ids == ["Q1", "A1", "Q2", "A2", "A2b"]
    ids, outcome = make(4)(SAMPLE)
    assert outcome == "dropped" and ids is None


def test_eod_counts_against_the_budget():
    total = len(SAMPLE.split())
    assert make(total, extra=0)(SAMPLE)[1] == "fit"
    assert make(total, extra=1)(SAMPLE)[1] == "trimmed_last_reasoning"


def test_long_sample_without_reasoning_is_dropped():
    assert make(3)("a b c d e") == (None, "dropped")


def test_with_real_sentencepiece(sp_model):
    tok = build_tokenizer("GPTSentencePieceTokenizer", sp_model)
    text = "Question: thetion? <think> " + " ".join(["proment ver ex ment"] * 40) + " </think> The answer is forty."
    n = len(tok.encode(text))
    trim = ReasoningTrimmer(tok.encode, tok.decode, n - 30, "<think>", "</think>")
    ids, outcome = trim(text)
    assert outcome == "trimmed_last_reasoning" and n - 40 < len(ids) <= n - 30
    out = tok.decode(ids)
    assert out.startswith("Question: thetion? <think>") and out.endswith("</think> The answer is forty.")


def test_bad_parameters():
    enc, dec = words_tokenizer()
    with pytest.raises(ValueError, match="--trim-max-length"):
        ReasoningTrimmer(enc, dec, 0)


ONE_BLOCK = "Q?<xxxxxx>A!.."        # 14 characters; answers "Q?A!.." 6; plain text with empty markers "Q?<>A!.." 8
TWO_BLOCKS = "Q<ab>C<xyz>D"         # 12 characters; without the first block "QC<xyz>D" 8; answers "QCD" 3


@pytest.mark.parametrize("text,max_length,extra,outcome,kept", [
    (ONE_BLOCK, 15, 0, "fit", ONE_BLOCK),
    (ONE_BLOCK, 14, 0, "fit", ONE_BLOCK),                              # exactly the budget
    (ONE_BLOCK, 14, 1, "trimmed_last_reasoning", "Q?<xxxxx>A!.."),      # EOD makes it budget + 1
    (ONE_BLOCK, 13, 0, "trimmed_last_reasoning", "Q?<xxxxx>A!.."),
    (ONE_BLOCK, 9, 0, "trimmed_last_reasoning", "Q?<x>A!.."),          # one reasoning character: exactly 9
    (ONE_BLOCK, 8, 0, "answers_only", "Q?A!.."),                       # empty markers alone fill it: no block
    (ONE_BLOCK, 7, 0, "answers_only", "Q?A!.."),                       # answers = budget - 1
    (ONE_BLOCK, 6, 0, "answers_only", "Q?A!.."),                       # answers = budget
    (ONE_BLOCK, 7, 1, "answers_only", "Q?A!.."),                       # answers = budget (EOD excluded)
    (ONE_BLOCK, 5, 0, "dropped", None),                                # answers = budget + 1
    (ONE_BLOCK, 6, 1, "dropped", None),
    (TWO_BLOCKS, 12, 0, "fit", TWO_BLOCKS),
    (TWO_BLOCKS, 11, 0, "trimmed_last_reasoning", "Q<ab>C<xy>D"),
    (TWO_BLOCKS, 10, 0, "trimmed_last_reasoning", "Q<ab>C<x>D"),
    (TWO_BLOCKS, 9, 0, "dropped_earlier_reasoning", "QC<xyz>D"),
    (TWO_BLOCKS, 8, 0, "dropped_earlier_reasoning", "QC<xyz>D"),      # exactly the budget
    (TWO_BLOCKS, 7, 0, "dropped_earlier_reasoning", "QC<xy>D"),
    (TWO_BLOCKS, 6, 0, "dropped_earlier_reasoning", "QC<x>D"),
    (TWO_BLOCKS, 5, 0, "answers_only", "QCD"),
    (TWO_BLOCKS, 3, 0, "answers_only", "QCD"),                        # answers = budget
    (TWO_BLOCKS, 2, 0, "dropped", None),
])
def test_budget_boundaries_with_a_character_tokenizer(text, max_length, extra, outcome, kept):
    """One token per character (lengths counted by hand in the comments), markers '<' '>': each outcome at
    budget - 1, budget and budget + 1 of its length. A sample whose tokens equal the budget fits it
    (max_length - extra_tokens); the kept text is exact."""
    trimmer = ReasoningTrimmer(list, "".join, max_length, "<", ">", extra_tokens=extra)
    ids, got = trimmer(text)
    assert (got, None if ids is None else "".join(ids)) == (outcome, kept)
    if ids is not None:
        assert len(ids) <= max_length - extra
