"""Tokenizers: Megatron's conventions for EOD/special tokens, vocab padding, HF tokenizer.json loading."""

import json

import pytest
import sentencepiece as spm

from megatron_zaya.data.tokenizer import build_tokenizer, pad_vocab_size


def reference_megatron_sp(sp, text):
    """Reference of Megatron's _SentencePieceTokenizer: vocab + appended specials, and its
    tokenize() loop (search each special in the remaining text, take the earliest by dict order)."""
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    specials = {}

    def add(t):
        if t not in vocab:
            vocab[t] = len(vocab)
        specials[t] = vocab[t]

    for t in ("<CLS>", "<SEP>", "<EOD>", "<MASK>"):
        add(t)
    for pid, default in ((sp.pad_id(), "<PAD>"), (sp.bos_id(), "<BOS>"), (sp.eos_id(), "<EOS>")):
        try:
            add(sp.id_to_piece(pid))
        except IndexError:
            add(default)
    ids, idx = [], 0
    while True:
        indices = {}
        for tok in specials:
            try:
                indices[tok] = text[idx:].index(tok)
            except ValueError:
                continue
        if not indices:
            break
        nxt = min(indices, key=indices.get)
        at = idx + indices[nxt]
        ids.extend(sp.encode_as_ids(text[idx:at]))
        ids.append(specials[nxt])
        idx = at + len(nxt)
    ids.extend(sp.encode_as_ids(text[idx:]))
    return ids, len(vocab), vocab["<EOD>"]


def test_pad_vocab_size():
    assert pad_vocab_size(262145) == 262272 == 2049 * 128
    assert pad_vocab_size(32000) == 32000
    assert pad_vocab_size(32001) == 32128
    assert pad_vocab_size(32001, 128, tensor_parallel_size=2) == 32256
    assert pad_vocab_size(1, 64) == 64


def test_gpt_sentencepiece(sp_model):
    sp = spm.SentencePieceProcessor(model_file=sp_model)
    tok = build_tokenizer("GPTSentencePieceTokenizer", sp_model)
    assert tok.vocab_size == 1000 and tok.padded_vocab_size == 1024
    assert (tok.eod, tok.bos, tok.pad) == (2, 1, 3) == (sp.eos_id(), sp.bos_id(), sp.pad_id())
    text = "Thetion proment café \u2603 <EOD> 12345"
    assert tok.encode(text) == sp.encode_as_ids(text)
    assert tok.encode_batch([text, "a"]) == [sp.encode_as_ids(text), sp.encode_as_ids("a")]
    # byte fallback: an unseen character round-trips instead of becoming <unk>
    assert tok.decode(tok.encode("snow \u2603 man")) == "snow \u2603 man"
    assert 0 not in tok.encode("\u2603")


@pytest.mark.parametrize("text", [
    "plain text without specials",
    "first doc<EOD>second doc",
    "<CLS> a <SEP> b <MASK><EOD>",
    "x</s>y<s>z<pad>w",
    "<EO<EOD>D>",
    "",
])
def test_megatron_sentencepiece_conventions(sp_model, text):
    sp = spm.SentencePieceProcessor(model_file=sp_model)
    tok = build_tokenizer("SentencePieceTokenizer", sp_model)
    ref_ids, ref_vocab, ref_eod = reference_megatron_sp(sp, text)
    assert tok.vocab_size == ref_vocab == 1004  # <CLS> <SEP> <EOD> <MASK> appended; pad/bos/eos exist
    assert tok.eod == ref_eod == 1002
    assert tok.encode(text) == ref_ids
    assert tok.encode_batch([text, "plain"]) == [ref_ids, sp.encode_as_ids("plain")]


def test_hf_tokenizer_json(tmp_path, hf_tokenizer_dir):
    import shutil

    from tokenizers import Tokenizer

    d = tmp_path / "hf"
    shutil.copytree(hf_tokenizer_dir, d)
    hf = Tokenizer.from_file(str(d / "tokenizer.json"))
    bos = hf.token_to_id("<bos>")
    tok = build_tokenizer("HuggingFaceTokenizer", str(d))
    assert tok.vocab_size == hf.get_vocab_size(with_added_tokens=True)
    assert (tok.eod, tok.bos, tok.pad) == (1, 2, 0)
    ids = tok.encode("Thetion proment")
    assert ids[0] == bos and ids == hf.encode("Thetion proment").ids
    assert tok.decode(ids[1:]) == "Thetion proment"
    # tokenizer_config.json decides EOS when present (as transformers would)
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<pad>"}}))
    assert build_tokenizer("HuggingFaceTokenizer", str(d / "tokenizer.json")).eod == 0


def test_null_tokenizer():
    tok = build_tokenizer("NullTokenizer", 1000)
    assert tok.vocab_size == 1001 and tok.eod == 1000 and tok.encode("5 7 9") == [5, 7, 9]


def test_bad_arguments_are_clear(tmp_path):
    with pytest.raises(ValueError, match="--tokenizer-type 'GPT2BPETokenizer' is not supported"):
        build_tokenizer("GPT2BPETokenizer", "x")
    with pytest.raises(FileNotFoundError, match="nope.model"):
        build_tokenizer("GPTSentencePieceTokenizer", str(tmp_path / "nope.model"))
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="not a valid SentencePiece model"):
        build_tokenizer("SentencePieceTokenizer", str(bad))
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        build_tokenizer("HuggingFaceTokenizer", str(tmp_path))


def test_train_unigram(tmp_path, corpus_dir):
    from data_test_utils import load_tool

    rc = load_tool("train_tokenizer").main(["--input", str(corpus_dir / "train.jsonl"), "--vocab-size", "600",
                                            "--model-type", "unigram", "--output-prefix", str(tmp_path / "u"),
                                            "--num-threads", "1"])
    assert rc == 0
    tok = build_tokenizer("GPTSentencePieceTokenizer", str(tmp_path / "u.model"))
    assert tok.vocab_size == 600 and tok.decode(tok.encode("Proment thetion.")) == "Proment thetion."
