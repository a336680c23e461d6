"""TikTokenizer (Megatron-LM's tiktoken-based tokenizer): ids against a pure-Python reference of
rank-ordered byte-pair merging, Megatron's layout of special tokens, the vocabulary file's checks,
and the vocabulary trainer of tools/train_tokenizer.py --model-type tiktoken."""
import base64
import json

import numpy as np
import pytest
import regex

from megatron_zaya.data.indexed import IndexedDataset
from megatron_zaya.data.tiktoken_vocab import train_tiktoken_ranks, write_tiktoken_vocab
from megatron_zaya.data.tokenizer import build_tokenizer
from megatron_zaya.data.tokenizer_tiktoken import TIKTOKEN_PATTERNS
from megatron_zaya.errors import UserInputError
from tests.training.conftest import run_tool

pytest.importorskip("tiktoken")

CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away!",
    "Numbers: 12345, 3.14159 and 2026-12-04 are written digit by digit.",
    "Ünïcödé wörds, naïve café, 東京 and Привет мир appear too.\n\n  Indented line\twith tab.",
    "CamelCaseWords and snake_case_words, URLs like https://example.com/a/b?c=d.",
    "She said: \"it's done\" -- we'll see, they're sure, I'd say, you've won.",
] * 6
SAMPLES = [
    "The lazy fox, the quick dog.",
    "  leading spaces and trailing   ",
    "digits 9876543210 and 3.14",
    "Ünïcödé 東京 Привет",
    "line one\nline two\r\n\n\ttabbed",
    "CamelCase HTTPServer's url/path//x",
    "special text </s> <s> <unk> stays ordinary",
    "",
    "emoji 🙂🙂 and a lone \u00e9\u0301 combining mark",
]


def reference_encode(text: str, ranks: dict[bytes, int], pattern: str, offset: int) -> list[int]:
    """tiktoken's algorithm, written plainly: split by the pattern, then in each piece merge the
    adjacent pair whose joined bytes have the lowest rank (leftmost on ties) until none is a token."""
    ids = []
    for piece in regex.findall(TIKTOKEN_PATTERNS[pattern], text):
        parts = [bytes([b]) for b in piece.encode("utf-8")]
        while len(parts) > 1:
            candidates = [(ranks.get(parts[i] + parts[i + 1]), i) for i in range(len(parts) - 1)]
            candidates = [(r, i) for r, i in candidates if r is not None]
            if not candidates:
                break
            _, i = min(candidates)
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        ids += [ranks[p] + offset for p in parts]
    return ids


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    """{pattern: (path, token bytes by rank)}: a ~600-rank vocabulary trained per pattern."""
    folder = tmp_path_factory.mktemp("tiktoken")
    made = {}
    for pattern in ("v1", "v2"):
        tokens = train_tiktoken_ranks(CORPUS, 600, pattern)
        path = folder / f"{pattern}.json"
        write_tiktoken_vocab(tokens, str(path))
        made[pattern] = (str(path), tokens)
    return made


@pytest.mark.parametrize("pattern", ["v1", "v2"])
def test_ids_equal_the_reference_merge_by_rank(vocab, pattern):
    path, tokens = vocab[pattern]
    assert len(tokens) > 400 and tokens[:256] == [bytes([b]) for b in range(256)]
    special = 10
    tok = build_tokenizer("TikTokenizer", path, tiktoken_pattern=pattern, tokenizer_vocab_size=len(tokens) + special,
                          tiktoken_num_special_tokens=special)
    ranks = {t: r for r, t in enumerate(tokens)}
    merged = 0
    for text in SAMPLES + CORPUS[:5]:
        ids = tok.encode(text)
        assert ids == reference_encode(text, ranks, pattern, special), text
        assert tok.decode(ids) == text
        merged += sum(i >= special + 256 for i in ids)
    assert merged > 50                       # the merges were used, not only single bytes
    assert tok.encode_batch(SAMPLES) == [tok.encode(t) for t in SAMPLES]


def test_megatron_layout_of_special_tokens(vocab):
    """ids 0..S-1: the given special tokens then <SPECIAL_k> fillers; EOD = </s>, BOS = <s>; ranks
    shifted by S; special tokens written in a text are ordinary text; the vocabulary is cut to V."""
    path, tokens = vocab["v2"]
    tok = build_tokenizer("TikTokenizer", path, tiktoken_pattern="v2", tokenizer_vocab_size=400 + 8,
                          tiktoken_num_special_tokens=8,
                          tokenizer_special_tokens=["<unk>", "<s>", "</s>", "<|im_start|>"],
                          make_vocab_size_divisible_by=128)
    assert tok.special_tokens == {"<unk>": 0, "<s>": 1, "</s>": 2, "<|im_start|>": 3, "<SPECIAL_4>": 4,
                                  "<SPECIAL_5>": 5, "<SPECIAL_6>": 6, "<SPECIAL_7>": 7}
    assert (tok.eod, tok.bos, tok.unk, tok.pad) == (2, 1, 0, None)
    assert tok.vocab_size == 408 and tok.padded_vocab_size == 512
    assert tok.encode("a") == [8 + ord("a")]
    ids = tok.encode("x </s> y")
    assert 2 not in ids and tok.decode(ids) == "x </s> y"
    assert tok.decode([1, 8 + ord("h"), 8 + ord("i"), 2]) == "<s>hi</s>"
    ranks = {t: r for r, t in enumerate(tokens[:400])}      # ranks past V - S are not used
    text = " ".join(CORPUS[:5])
    assert tok.encode(text) == reference_encode(text, ranks, "v2", 8)
    assert max(tok.encode(text)) < 408
    default = build_tokenizer("TikTokenizer", path, tiktoken_pattern="v2", tokenizer_vocab_size=1000 + 300)
    assert (default.eod, default.bos, default.encode("a")) == (2, 1, [1000 + ord("a")])


def write_entries(path, entries):
    path.write_text(json.dumps(entries))
    return str(path)


def byte_entries(count=256):
    return [{"rank": i, "token_bytes": base64.b64encode(bytes([i])).decode(), "token_str": ""} for i in range(count)]


@pytest.mark.parametrize("make, settings, expected", [
    (lambda p: str(p / "missing.json"), {}, "missing.json: TikTokenizer vocabulary file (JSON) not found"),
    (lambda p: write_entries(p / "v.json", byte_entries()), {"tiktoken_pattern": None},
     "needs --tiktoken-pattern v1 or v2"),
    (lambda p: write_entries(p / "v.json", byte_entries()), {"tokenizer_vocab_size": 400},
     "v.json: holds 256 tokens, but --vocab-size and --tiktoken-num-special-tokens ask for 390"),
    (lambda p: write_entries(p / "v.json", {"a": 1}), {}, "is a JSON list"),
    (lambda p: str((p / "v.json").write_text("[{") and p / "v.json"), {}, "v.json: not valid JSON"),
    (lambda p: write_entries(p / "v.json", byte_entries()[:3] + [{"rank": 7, "token_bytes": "AA=="}] + byte_entries()[4:]),
     {}, "entry 3 has rank 7"),
    (lambda p: write_entries(p / "v.json", [dict(e, token_bytes="QQ==") if e["rank"] == 5 else e for e in byte_entries()]),
     {}, "entry 5: the first 256 entries must be the single bytes"),
    (lambda p: write_entries(p / "v.json", byte_entries() + [{"rank": 256, "token_bytes": "not base64!"}]),
     {"tokenizer_vocab_size": 267}, "entry 256: token_bytes is not base64"),
    (lambda p: write_entries(p / "v.json", byte_entries() + [{"rank": 256, "token_bytes": "QQ=="}]),
     {"tokenizer_vocab_size": 267}, "entry 256: token b'A' is empty or already has rank 65"),
    (lambda p: write_entries(p / "v.json", byte_entries()), {"tokenizer_special_tokens": ["<s>", "</s>"]},
     "must include <unk> <s> </s> (missing: <unk>)"),
    (lambda p: write_entries(p / "v.json", byte_entries()),
     {"tokenizer_special_tokens": ["<unk>", "<s>", "</s>", "<s>"]}, "'<s>' is given more than once"),
    (lambda p: write_entries(p / "v.json", byte_entries()), {"tiktoken_num_special_tokens": 2},
     "--tiktoken-num-special-tokens=2: at least 3"),
    (lambda p: write_entries(p / "v.json", byte_entries()), {"tokenizer_vocab_size": 200},
     "--vocab-size=200 leaves no room for the 256 byte tokens"),
])
def test_bad_vocabulary_files_and_settings_are_named(tmp_path, make, settings, expected):
    path = make(tmp_path)
    kwargs = dict(tiktoken_pattern="v2", tokenizer_vocab_size=266, tiktoken_num_special_tokens=10) | settings
    with pytest.raises(UserInputError, match=None) as err:
        build_tokenizer("TikTokenizer", path, **kwargs)
    assert expected in str(err.value), str(err.value)


def test_tiktoken_settings_are_refused_with_another_tokenizer(tmp_path):
    with pytest.raises(UserInputError, match="--tiktoken-pattern is read only by --tokenizer-type TikTokenizer"):
        build_tokenizer("NullTokenizer", "100", tiktoken_pattern="v2")
    with pytest.raises(UserInputError, match="--vocab-size is read only by --tokenizer-type TikTokenizer"):
        build_tokenizer("NullTokenizer", "100", tokenizer_vocab_size=300)


def test_tiktoken_training_learns_tokens_that_hold_newlines(tmp_path):
    """Byte-level BPE pieces hold newlines (the patterns' \\s*[\\r\\n]+): documents are fed whole, not cut
    into lines without their newlines (no learned token had one)."""
    code = "def f(x):\n    if x:\n        return 1\n\n\n    return 2\n"
    docs = tmp_path / "code.jsonl"
    docs.write_text("".join(json.dumps({"text": code.replace("x", name)}) + "\n" for name in ("a", "b", "cc", "dd")))
    prefix = tmp_path / "tt"
    assert run_tool("train_tokenizer", ["--input", str(docs), "--vocab-size", "300", "--output-prefix", str(prefix),
                                        "--model-type", "tiktoken"]) == 0
    learned = [base64.b64decode(e["token_bytes"]) for e in json.loads((tmp_path / "tt.json").read_text())[256:]]
    assert any(b"\n" in token for token in learned), learned


def test_tiktoken_training_reads_long_documents_in_pieces_of_whole_lines():
    """A document fed whole to the BPE trainer cost ~80 bytes of memory per byte (4 GB for 50 MB): it goes in
    pieces of whole lines, newlines kept, none over 64K characters unless one line is."""
    from data_test_utils import load_tool
    text_chunks = load_tool("train_tokenizer").text_chunks
    text = "".join(f"line {i} " * (i % 7 + 1) + "\n" * (i % 3 + 1) for i in range(20_000)) + "x" * 70_000 + "\nend"
    pieces = list(text_chunks(text))
    assert "".join(pieces) == text and len(pieces) > 5
    assert all(len(p) <= 1 << 16 or "\n" not in p.rstrip("\n") for p in pieces)
    assert all(p.endswith("\n") for p in pieces[:-1])
    assert list(text_chunks("short\n\ntext")) == ["short\n\ntext"]


def test_train_tokenizer_then_preprocess_with_tiktoken(tmp_path):
    """tools/train_tokenizer.py --model-type tiktoken writes P.json; preprocess_data.py encodes with it
    (EOD = </s> appended), giving the tokenizer's own ids."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in CORPUS))
    prefix = tmp_path / "tok" / "tt"
    assert run_tool("train_tokenizer", ["--input", str(docs), "--vocab-size", "500", "--output-prefix", str(prefix),
                                        "--model-type", "tiktoken", "--tiktoken-pattern", "v1"]) == 0
    entries = json.loads((tmp_path / "tok" / "tt.json").read_text())
    assert [e["rank"] for e in entries] == list(range(len(entries))) and 300 < len(entries) <= 500
    assert not [p for p in (tmp_path / "tok").iterdir() if p.name.startswith(".")]    # no temporary left
    # an existing vocabulary is kept unless --overwrite
    assert run_tool("train_tokenizer", ["--input", str(docs), "--vocab-size", "300", "--output-prefix", str(prefix),
                                        "--model-type", "tiktoken"]) == 2
    assert json.loads((tmp_path / "tok" / "tt.json").read_text()) == entries
    flags = ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", str(prefix) + ".json", "--tiktoken-pattern", "v1",
             "--vocab-size", str(len(entries) + 16), "--tiktoken-num-special-tokens", "16"]
    assert run_tool("preprocess_data", ["--input", str(docs), "--output-prefix", str(tmp_path / "corpus"),
                                        "--append-eod", "--no-progress", *flags]) == 0
    tok = build_tokenizer("TikTokenizer", str(prefix) + ".json", tiktoken_pattern="v1",
                          tokenizer_vocab_size=len(entries) + 16, tiktoken_num_special_tokens=16)
    data = IndexedDataset(str(tmp_path / "corpus_text_document"))
    assert len(data) == len(CORPUS)
    for i in (0, 2, 3):
        assert np.asarray(data.document(i)).tolist() == tok.encode(CORPUS[i]) + [2]


@pytest.mark.parametrize("pattern", sorted(TIKTOKEN_PATTERNS))
def test_every_learned_token_occurs_in_the_training_text(pattern):
    """A merge (left, right) makes the token left + right, in that order: every learned token (rank >= 256) is
    a run of bytes seen in the training text (the reference: a substring search of the UTF-8 corpus), and
    the ranks are distinct."""
    tokens = train_tiktoken_ranks(CORPUS, 400, pattern)
    corpus = "\n".join(CORPUS).encode("utf-8")
    assert len(tokens) > 300 and len(set(tokens)) == len(tokens)
    absent = [t for t in tokens[256:] if t not in corpus]
    assert not absent, absent[:5]
