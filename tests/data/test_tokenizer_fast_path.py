"""The memoized word path of the SentencePiece tokenizers must give exactly SentencePiece's ids."""

import json
import random

import numpy as np
import pytest
import sentencepiece as spm

from megatron_zaya.data.tokenizer import build_tokenizer

CHARS = " \t\n\r  abcdefghxyz.,;:!?'\"()-0123456789ABCZ<>/_"


def weird_texts(n=1500, seed=0, extra=""):
    rnd = random.Random(seed)
    chars = CHARS + extra
    return ["".join(rnd.choice(chars) for _ in range(rnd.randint(0, 120))) for _ in range(n)]


def corpus_texts(corpus_dir):
    return [json.loads(l)["text"] for l in open(corpus_dir / "train.jsonl")]


def test_gpt_sentencepiece_fast_path_is_exact(sp_model, corpus_dir):
    sp = spm.SentencePieceProcessor(model_file=sp_model)
    tok = build_tokenizer("GPTSentencePieceTokenizer", sp_model)
    assert tok._word_cache_enabled
    texts = corpus_texts(corpus_dir) + weird_texts() + weird_texts(300, 1, extra="\u00e9\u2603\x0b\x1c\x0c\x00")
    random.Random(3).shuffle(texts)
    expected = [sp.encode_as_ids(t) for t in texts]
    assert tok.encode_batch(texts) == expected
    assert tok.encode_batch(texts) == expected  # warm cache
    tokens, lengths = tok.encode_batch_flat(texts)
    assert lengths.tolist() == [len(e) for e in expected]
    assert tokens.tolist() == [i for e in expected for i in e]


def test_megatron_sentencepiece_fast_path_keeps_specials(sp_model):
    tok = build_tokenizer("SentencePieceTokenizer", sp_model)
    texts = weird_texts(800, 5, extra="<>") + ["a <EOD> b", "<CLS>x<SEP>", "plain words only"]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
    tokens, lengths = tok.encode_batch_flat(texts)
    assert tokens.tolist() == [i for t in texts for i in tok.encode(t)]
    assert tok.encode_batch(["x<EOD>"])[0][-1] == tok.eod


@pytest.mark.parametrize("option", [{"split_by_whitespace": False}, {"remove_extra_whitespaces": False}])
def test_fast_path_disabled_when_unsound(tmp_path, corpus_dir, option):
    """Pieces spanning words, or a normalizer that keeps repeated spaces: no word memoization."""
    lines = []
    for t in corpus_texts(corpus_dir)[:150]:
        lines.extend(t.split(". "))
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(tmp_path / "m"), vocab_size=800,
                                   model_type="bpe", minloglevel=2, num_threads=1, **option)
    model = str(tmp_path / "m.model")
    sp = spm.SentencePieceProcessor(model_file=model)
    tok = build_tokenizer("GPTSentencePieceTokenizer", model)
    assert not tok._word_cache_enabled
    texts = lines[:300] + weird_texts(300)
    assert tok.encode_batch(texts) == [sp.encode_as_ids(t) for t in texts]
    tokens, lengths = tok.encode_batch_flat(texts)
    assert tokens.tolist() == [i for t in texts for i in sp.encode_as_ids(t)]


def test_no_word_cache_for_a_unigram_model(tmp_path, corpus_dir):
    """A unigram model's Viterbi breaks ties between equal-score splits by sums over the text before the
    word: its words are not context-free (a corpus of code gave other ids for "0x000E" after "    # ")."""
    texts = corpus_texts(corpus_dir)[:200]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_prefix=str(tmp_path / "u"), vocab_size=600,
                                   model_type="unigram", minloglevel=2, num_threads=1)
    model = str(tmp_path / "u.model")
    tok = build_tokenizer("GPTSentencePieceTokenizer", model)
    assert not tok._word_cache_enabled
    sp = spm.SentencePieceProcessor(model_file=model)
    assert tok.encode_batch(texts[:50]) == [sp.encode_as_ids(t) for t in texts[:50]]


def test_word_cache_cap_keeps_results_exact(sp_model, corpus_dir, monkeypatch):
    from megatron_zaya.data.tokenizer import GPTSentencePieceTokenizer

    monkeypatch.setattr(GPTSentencePieceTokenizer, "_CACHE_LIMIT", 50)
    sp = spm.SentencePieceProcessor(model_file=sp_model)
    tok = build_tokenizer("GPTSentencePieceTokenizer", sp_model)
    texts = corpus_texts(corpus_dir)
    for i in range(0, len(texts), 40):
        batch = texts[i:i + 40]
        assert tok.encode_batch(batch) == [sp.encode_as_ids(t) for t in batch]
        assert len(tok._wid) <= max(50, len(set(w for t in batch for w in t.split())))


def test_fast_path_is_exact_on_non_ascii_whitespace_and_combining_marks(sp_model):
    """str.split() breaks words at U+0085, U+2028, U+3000 and NBSP, which SentencePiece does not all treat as
    whitespace, and NFKC composes combining marks with the letter before them: the fast path must give exactly
    SentencePiece's ids (sp.encode_as_ids, the reference; exact equality) on such texts, alone and mixed with
    ASCII ones."""
    sp = spm.SentencePieceProcessor(model_file=sp_model)
    tok = build_tokenizer("GPTSentencePieceTokenizer", sp_model)
    assert tok._word_cache_enabled
    texts = ["the cat\u0085sat down", "one\u2028two three", "alpha\u3000beta gamma", "a\u00a0b c", "new\u00a0line",
             "cafe\u0301 and e\u0301clair", "x\u0300 y", "\u2029para one", "a \u3000 b", "tab\u000bbed"]
    texts += ["plain ascii words", "more plain words"] + weird_texts(200, 7, extra="\u0085\u2028\u3000\u00a0\u0301")
    expected = [sp.encode_as_ids(t) for t in texts]
    tokens, lengths = tok.encode_batch_flat(texts)
    assert lengths.tolist() == [len(e) for e in expected]
    assert tokens.tolist() == [i for e in expected for i in e]
    assert tok.encode_batch(texts) == expected
