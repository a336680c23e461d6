"""GPT2BPETokenizer against a pure-Python GPT-2 byte-level BPE, and Llama2Tokenizer's BOS.

The reference below is GPT-2's published algorithm written out here (byte-to-symbol table, the
pre-tokenizing pattern, lowest-rank merge first), independent of the `tokenizers` package that
runs our tokenizer. The vocabulary is a small byte-level BPE trained on the test corpus
(`gpt2_files` in tests/data/conftest.py).
"""

import json

import numpy as np
import pytest
import regex
import sentencepiece as spm

from megatron_zaya.data.tokenizer import build_tokenizer, check_tokenizer_flags
from megatron_zaya.errors import UserInputError

GPT2_PATTERN = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

TEXTS = [
    "Hello world", "  leading and trailing spaces  ", "tabs\tand\nnew\n\nlines\r\n", "Don't we'll they've I'd",
    "numbers 12345 and 3.14159", "café naïve — “quotes” ünïcödé", "日本語のテキスト", "emoji 🙂🚀 mixed",
    "literal <|endoftext|> in text", "", " ", "a" * 300, "x!!y ?? (a)[b]{c}",
]


class ReferenceGPT2BPE:
    def __init__(self, vocab_path, merges_path):
        self.encoder = json.load(open(vocab_path, encoding="utf-8"))
        self.decoder = {v: k for k, v in self.encoder.items()}
        lines = open(merges_path, encoding="utf-8").read().split("\n")
        merges = [tuple(line.split()) for line in lines if line and not line.startswith("#version")]
        self.ranks = {pair: i for i, pair in enumerate(merges)}
        printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
        extra = iter(range(256, 512))
        self.byte_symbol = {b: chr(b) if b in printable else chr(next(extra)) for b in range(256)}
        self.symbol_byte = {s: b for b, s in self.byte_symbol.items()}

    def bpe(self, word):
        parts = list(word)
        while len(parts) > 1:
            pairs = {(a, b) for a, b in zip(parts, parts[1:])}
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return parts

    def encode(self, text):
        ids = []
        for piece in GPT2_PATTERN.findall(text):
            word = "".join(self.byte_symbol[b] for b in piece.encode("utf-8"))
            ids.extend(self.encoder[p] for p in self.bpe(word))
        return ids

    def decode(self, ids):
        data = bytes(self.symbol_byte[c] for i in ids for c in self.decoder[i])
        return data.decode("utf-8", errors="replace")


def test_gpt2_bpe_matches_the_reference_algorithm(gpt2_files, corpus_dir):
    vocab, merges = gpt2_files
    tok = build_tokenizer("GPT2BPETokenizer", None, vocab_file=str(vocab), merge_file=str(merges))
    ref = ReferenceGPT2BPE(vocab, merges)
    corpus = [json.loads(line)["text"] for line in open(corpus_dir / "train.jsonl")][:50]
    texts = TEXTS + corpus
    assert any(len(ref.encode(t)) < len(t.encode("utf-8")) for t in texts)   # merges are really applied
    for text in texts:
        assert tok.encode(text) == ref.encode(text), text
    assert tok.encode_batch(texts) == [ref.encode(t) for t in texts]
    assert all(tok.decode(tok.encode(t)) == t for t in texts)
    eod = json.load(open(vocab))["<|endoftext|>"]
    assert tok.eod == eod and eod not in tok.encode("literal <|endoftext|> in text")   # Megatron: text is never special
    assert tok.vocab_size == 600 and tok.padded_vocab_size == 640
    broken = tok.encode("é")[:1] if len(tok.encode("é")) > 1 else [ref.encoder[ref.byte_symbol[0xC3]]]
    assert tok.decode(broken) == ref.decode(broken) == "\ufffd"                        # errors="replace"


def test_gpt2_bpe_files_from_a_folder_or_flags(gpt2_files, tmp_path):
    vocab, merges = gpt2_files
    megatron_names = tmp_path / "megatron"
    megatron_names.mkdir()
    (megatron_names / "gpt2-vocab.json").write_bytes(vocab.read_bytes())
    (megatron_names / "gpt2-merges.txt").write_bytes(merges.read_bytes())
    for folder in (vocab.parent, megatron_names):
        tok = build_tokenizer("GPT2BPETokenizer", str(folder))
        assert tok.encode("Hello world") == build_tokenizer("GPT2BPETokenizer", None, vocab_file=str(vocab),
                                                            merge_file=str(merges)).encode("Hello world")


@pytest.mark.parametrize("model, vocab_file, merge_file, expected", [
    (None, None, None, "needs --vocab-file"),
    (None, "VOCAB", None, "needs --merge-file"),
    (None, "nope.json", "MERGES", "--vocab-file nope.json: file not found"),
    ("VOCAB", None, None, "takes a folder"),
    ("EMPTY_DIR", None, None, "none of ['vocab.json', 'gpt2-vocab.json'] is in the folder"),
])
def test_gpt2_flag_errors_name_the_flag(gpt2_files, tmp_path, model, vocab_file, merge_file, expected):
    vocab, merges = gpt2_files
    names = {"VOCAB": str(vocab), "MERGES": str(merges), "EMPTY_DIR": str(tmp_path)}
    args = [names.get(a, a) for a in (model, vocab_file, merge_file)]
    with pytest.raises(UserInputError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        check_tokenizer_flags("GPT2BPETokenizer", *args)


def test_gpt2_files_are_refused_for_other_types(sp_model, gpt2_files):
    with pytest.raises(UserInputError, match="--vocab-file is read only by --tokenizer-type GPT2BPETokenizer"):
        check_tokenizer_flags("GPTSentencePieceTokenizer", sp_model, str(gpt2_files[0]), None)


def test_damaged_gpt2_files_are_named(gpt2_files, tmp_path):
    vocab, merges = gpt2_files
    table = json.load(open(vocab))
    cases = {
        "not_json.json": ("{", "not valid JSON"),
        "gap.json": (json.dumps({**table, "extra": len(table) + 5}), "the ids must be 0.."),
        "no_eod.json": (json.dumps({k: v for k, v in table.items() if k != "<|endoftext|>"}), None),
        "bytes.json": (json.dumps({"<|endoftext|>": 0, "a": 1}), "byte symbols are missing"),
    }
    for name, (text, expected) in cases.items():
        path = tmp_path / name
        if expected is None:   # renumber so that only the missing EOD is wrong
            text = json.dumps({k: i for i, k in enumerate(json.loads(text))})
            expected = "no <|endoftext|> token"
        path.write_text(text)
        with pytest.raises(UserInputError, match=f"{name}: .*{expected}".replace("|", r"\|")):
            build_tokenizer("GPT2BPETokenizer", None, vocab_file=str(path), merge_file=str(merges))
    bad_merges = tmp_path / "merges.txt"
    bad_merges.write_text("#version: 0.2\nzzzq qqqz\n")
    with pytest.raises(UserInputError, match="--merge-file .*merges.txt: not GPT-2 merges"):
        build_tokenizer("GPT2BPETokenizer", None, vocab_file=str(vocab), merge_file=str(bad_merges))


def test_llama2_tokenizer_puts_bos_in_front(sp_model):
    sp = spm.SentencePieceProcessor(model_file=sp_model)
    tok = build_tokenizer("Llama2Tokenizer", sp_model)
    texts = ["Hello there world", "", "café 日本", "two  spaces\nand lines"]
    expected = [[sp.bos_id()] + sp.encode(t) for t in texts]
    assert [tok.encode(t) for t in texts] == expected == tok.encode_batch(texts)
    flat, lengths = tok.encode_batch_flat(texts)
    assert lengths.tolist() == [len(e) for e in expected] and flat.dtype == np.int32
    assert flat.tolist() == [i for e in expected for i in e]
    assert (tok.eod, tok.vocab_size) == (sp.eos_id(), sp.get_piece_size())
    assert tok.decode(tok.encode("Hello there world")) == "Hello there world"
