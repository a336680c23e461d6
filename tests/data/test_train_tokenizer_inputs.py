"""tools/train_tokenizer.py's reading of its corpus: plain-text files (each --text-mode), the JSONL
records it skips, counted by reason (not UTF-8, malformed, not an object, no string under --json-keys), and an
input that fails to read part-way."""
import json

import pytest
import sentencepiece as spm

from megatron_zaya.data.synthetic import TextGenerator

from data_test_utils import load_tool


def test_plain_text_files_give_their_non_blank_lines_in_every_text_mode(tmp_path):
    tool = load_tool("train_tokenizer")
    path = tmp_path / "book.txt"
    path.write_bytes(b"First line\r\nsecond line\n\n  \nThird para\n")
    expected = ["First line", "second line", "Third para"]
    for mode in ("file", "paragraph", "line"):
        counts = {}
        assert list(tool.iter_lines([str(path)], ["text"], mode, counts)) == expected, mode
        documents = {"file": 1, "paragraph": 2, "line": 5}[mode]           # blank lines are records in line mode
        assert counts == {"documents": documents, "lines": 3}, (mode, counts)
    counts = {}
    assert list(tool.iter_lines([str(path)], ["text"], "file", counts, whole_documents=True)) == \
        ["First line\r\nsecond line\n\n  \nThird para\n"]    # (the bytes as they are: byte-level BPE sees them)


def test_skipped_jsonl_records_are_counted_by_reason(tmp_path):
    tool = load_tool("train_tokenizer")
    path = tmp_path / "docs.jsonl"
    lines = [json.dumps({"text": "good one\nand two", "title": "T"}).encode(),
             b"",
             b"{\"text\": \"caf\xe9\"}",                       # Latin-1, not UTF-8
             b"{\"text\": broken",
             b"[1, 2]",
             json.dumps({"other": "x", "text": 5}).encode(),
             b"{\"text\": \"lone \\ud83d surrogate\"}",
             json.dumps({"title": "only the title"}).encode()]
    path.write_bytes(b"\n".join(lines) + b"\n")
    counts = {}
    got = list(tool.iter_lines([str(path)], ["text"], "file", counts))
    assert got == ["good one", "and two"]
    assert counts == {"documents": 1, "lines": 2, "not UTF-8": 1, "malformed JSON": 1, "not a JSON object": 1,
                      "no string under --json-keys text": 2, "invalid Unicode": 1}
    counts = {}
    got = list(tool.iter_lines([str(path)], ["text", "title"], "file", counts))
    assert got == ["good one", "and two", "T", "only the title"]
    assert counts["documents"] == 2 and counts["no string under --json-keys text title"] == 1


def test_a_tokenizer_trains_on_a_plain_text_corpus(tmp_path):
    gen = TextGenerator(seed=4, lexicon_size=500)
    text = "\n\n".join(gen.document(max_sentences=6) for _ in range(150))
    (tmp_path / "corpus.txt").write_text(text, encoding="utf-8")
    tool = load_tool("train_tokenizer")
    assert tool.main(["--input", str(tmp_path / "corpus.txt"), "--text-mode", "paragraph", "--vocab-size", "500",
                      "--output-prefix", str(tmp_path / "sp"), "--num-threads", "1"]) == 0
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    assert sp.get_piece_size() == 500
    sample = gen.document(max_sentences=2)
    assert sp.decode_ids(sp.encode_as_ids(sample)) == sample
    assert len(sp.encode_as_ids(sample)) < len(sample.encode()) / 2     # it learned the corpus's words


@pytest.mark.parametrize("model_type,sample", [("unigram", 0), ("unigram", 1000), ("tiktoken", 0)])
def test_an_input_cut_short_stops_the_run_with_one_line_naming_it(tmp_path, capsys, model_type, sample):
    """A .zst cut short past its first records (an interrupted download): each trainer stops with the reading's
    error, exit 2, and no output. SentencePiece reading the lines itself (--input-sentence-size 0) gave
    'SentencePiece training failed: INTERNAL: InputError: ...' with a Python stack, exit 1."""
    zstandard = pytest.importorskip("zstandard")
    data = "".join(json.dumps({"text": f"line {i} of a corpus"}) + "\n" for i in range(20_000)).encode()
    packed = zstandard.ZstdCompressor().compress(data)
    (tmp_path / "cut.jsonl.zst").write_bytes(packed[:len(packed) // 2])
    tool = load_tool("train_tokenizer")
    assert tool.main(["--input", str(tmp_path / "cut.jsonl.zst"), "--output-prefix", str(tmp_path / "tok"),
                      "--model-type", model_type, "--vocab-size", "300", "--input-sentence-size", str(sample),
                      "--num-threads", "1"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"error: --input {tmp_path / 'cut.jsonl.zst'}: read failed (corrupt zstd data: "
                                        "the file ends inside a zstd frame (truncated))"], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.jsonl.zst"]


@pytest.mark.parametrize("seed", ["-1", str(2 ** 32)])
def test_a_seed_sentencepiece_cannot_take_is_refused_before_the_input_is_read(tmp_path, capsys, seed):
    """SentencePiece's generator takes an unsigned 32-bit seed: --seed -1 was a pybind traceback after the
    corpus was read."""
    from tests.data.data_test_utils import load_tool
    code = load_tool("train_tokenizer").main(["--input", str(tmp_path / "not_read.jsonl"), "--vocab-size", "300",
                                              "--output-prefix", str(tmp_path / "t"), "--seed", seed])
    assert code == 2 and f"--seed must be in [0, 2**32 - 1], got {seed}" in capsys.readouterr().err
