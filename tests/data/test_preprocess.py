"""tools/preprocess_data.py and tools/merge_datasets.py end to end on small generated corpora."""

import gzip
import json
import os

import numpy as np
import pytest
import sentencepiece as spm

from data_test_utils import load_tool, run_preprocess
from megatron_zaya.data import preprocess as pre
from megatron_zaya.data.indexed import IndexedDataset
from megatron_zaya.data.tokenizer import build_tokenizer

PRE = load_tool("preprocess_data")
MERGE = load_tool("merge_datasets")


def docs_of(prefix):
    ds = IndexedDataset(prefix)
    return [ds.document(i).tolist() for i in range(ds.num_documents)]


def run_tool(*args):
    return run_preprocess(PRE, *args)


def test_jsonl_matches_megatron_convention_and_counts_bad_lines(tmp_path, sp_model, corpus_dir, capsys):
    sp = spm.SentencePieceProcessor(model_file=sp_model)
    good = [json.loads(l)["text"] for l in open(corpus_dir / "train.jsonl")][:20]
    path = tmp_path / "in.jsonl"
    with open(path, "wb") as f:
        for i, t in enumerate(good):
            f.write((json.dumps({"text": t, "id": i}) + "\n").encode())
            if i == 3:
                f.write(b'{"text": "broken\n')                      # line 5: malformed JSON
            if i == 5:
                f.write(b'{"other": "no text key"}\n')              # line 8: missing key
            if i == 7:
                f.write(b'{"text": "caf\xe9 latin-1"}\n')           # line 11: not UTF-8
            if i == 9:
                f.write(b'{"text": ""}\n')                          # line 14: empty document
            if i == 11:
                f.write(b"\n")                                       # line 17: blank line
            if i == 13:
                f.write(b'{"text": 42}\n')                          # line 20: not a string
    out = tmp_path / "out"
    assert run_tool("--input", path, "--output-prefix", out, "--tokenizer-type", "GPTSentencePieceTokenizer",
                    "--tokenizer-model", sp_model, "--append-eod") == 0
    summary = capsys.readouterr().out
    expected = [sp.encode_as_ids(t) + [sp.eos_id()] for t in good]
    assert docs_of(str(out) + "_text_document") == expected
    assert IndexedDataset(str(out) + "_text_document").dtype == np.uint16
    for reason, where in [("malformed JSON", "in.jsonl:5"), ("missing key 'text'", "in.jsonl:8"),
                          ("not UTF-8", "in.jsonl:11"), ("empty document", "in.jsonl:14"),
                          ("blank line", "in.jsonl:17"), ("key 'text' is not a string", "in.jsonl:20")]:
        line = next(l for l in summary.splitlines() if l.strip().startswith(reason))
        assert ": 1" in line and where in line, line
    assert f"documents: {len(good)}" in summary and "skipped:   6" in summary
    assert "in.jsonl:5 (Invalid control character at column 17)" in summary     # json's "at" said once


def test_an_output_prefix_under_a_file_is_refused_naming_the_flag(tmp_path, capsys):
    (tmp_path / "in.jsonl").write_text('{"text": "1 2"}\n')
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "sub" / "out"
    assert run_tool("--input", tmp_path / "in.jsonl", "--output-prefix", out, "--tokenizer-type", "NullTokenizer",
                    "--tokenizer-model", 100) == 2
    assert f"--output-prefix {out}: {tmp_path / 'afile'} is a file, not a folder" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["afile", "in.jsonl"]


def test_workers_and_chunks_give_identical_bytes(tmp_path, sp_model, corpus_dir):
    outs = []
    for workers, chunk in ((1, 1 << 20), (2, 3000)):
        cfg = pre.PreprocessConfig(input=[str(corpus_dir / "train.jsonl")], output_prefix=str(tmp_path / f"o{workers}"),
                                   tokenizer_type="GPTSentencePieceTokenizer", tokenizer_model=sp_model,
                                   append_eod=True, workers=workers, chunk_bytes=chunk, progress=False)
        s = pre.run(cfg)
        assert s["documents"] == 300
        outs.append([open(p + ext, "rb").read() for p in s["outputs"] for ext in (".bin", ".idx")])
    assert outs[0] == outs[1]


def test_sentencepiece_tokenizer_type_uses_eod_token(tmp_path, sp_model):
    path = tmp_path / "in.jsonl.gz"
    texts = ["hello world", "a<EOD>b", "third"]
    with gzip.open(path, "wt") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    assert run_tool("--input", path, "--output-prefix", tmp_path / "o", "--tokenizer-type", "SentencePieceTokenizer",
                    "--tokenizer-model", sp_model, "--append-eod") == 0
    tok = build_tokenizer("SentencePieceTokenizer", sp_model)
    got = docs_of(str(tmp_path / "o_text_document"))
    assert got == [tok.encode(t) + [tok.eod] for t in texts]
    assert got[1].count(tok.eod) == 2 and tok.eod == 1002


def test_plain_text_modes(tmp_path):
    d = tmp_path / "txt"
    d.mkdir()
    (d / "a.txt").write_text("1 2 3\n4\n\n\n5 6\n")
    (d / "b.txt").write_text("7 8\n")
    assert run_tool("--input", d, "--output-prefix", tmp_path / "f", "--tokenizer-type", "NullTokenizer",
                    "--tokenizer-model", 100, "--append-eod") == 0
    assert docs_of(str(tmp_path / "f_text_document")) == [[1, 2, 3, 4, 5, 6, 100], [7, 8, 100]]
    assert run_tool("--input", d / "a.txt", d / "b.txt", "--output-prefix", tmp_path / "p", "--tokenizer-type",
                    "NullTokenizer", "--tokenizer-model", 100, "--text-mode", "paragraph") == 0
    assert docs_of(str(tmp_path / "p_text_document")) == [[1, 2, 3, 4], [5, 6], [7, 8]]


@pytest.mark.parametrize("mode", ["line", "paragraph"])
def test_crlf_and_lf_text_give_the_same_documents(tmp_path, gpt2_files, mode):
    """--text-mode line/paragraph: a document ends at its line break, CR LF (Windows) as LF, and a paragraph's
    lines are joined by LF; with a byte-level tokenizer (GPT-2 BPE, which would give \\r its own id) a CRLF file
    and its LF twin give the same ids, and each document is the tokenizer's encoding of its text without the
    final break (the reference; exact)."""
    vocab, merges = gpt2_files
    tok = build_tokenizer("GPT2BPETokenizer", None, vocab_file=str(vocab), merge_file=str(merges))
    docs = ["first line of text", "second, with words", "third one"]
    if mode == "paragraph":
        docs[1] = "second, with words\nover two lines"
    separator = "\n" if mode == "line" else "\n\n"
    got = {}
    for name, eol in (("lf", "\n"), ("crlf", "\r\n")):
        path = tmp_path / f"{name}.txt"
        path.write_bytes((separator.join(docs) + "\n").replace("\n", eol).encode())
        assert run_tool("--input", path, "--output-prefix", tmp_path / name, "--tokenizer-type", "GPT2BPETokenizer",
                        "--vocab-file", vocab, "--merge-file", merges, "--text-mode", mode) == 0
        got[name] = docs_of(str(tmp_path / f"{name}_text_document"))
    assert got["crlf"] == got["lf"] == [tok.encode(d) for d in docs]
    assert tok.encode("a\r") != tok.encode("a")


def test_null_tokenizer_takes_megatrons_vocab_size_flag(tmp_path):
    """Megatron-LM's `--tokenizer-type NullTokenizer --vocab-size V`: the same output as --tokenizer-model V
    (it was refused as a TikTokenizer-only flag)."""
    (tmp_path / "a.txt").write_text("1 2 3\n")
    assert run_tool("--input", tmp_path / "a.txt", "--output-prefix", tmp_path / "v", "--tokenizer-type",
                    "NullTokenizer", "--vocab-size", 100, "--append-eod") == 0
    assert docs_of(str(tmp_path / "v_text_document")) == [[1, 2, 3, 100]]


def test_several_keys_and_sentence_lists(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"q": "1 2", "a": ["3", "4 5"]}) + "\n" + json.dumps({"q": "6", "a": "7"}) + "\n")
    assert run_tool("--input", path, "--json-keys", "q", "a", "--output-prefix", tmp_path / "o",
                    "--tokenizer-type", "NullTokenizer", "--tokenizer-model", 10, "--append-eod") == 0
    assert docs_of(str(tmp_path / "o_q_document")) == [[1, 2, 10], [6, 10]]
    a = IndexedDataset(str(tmp_path / "o_a_document"))
    assert a.document_indices.tolist() == [0, 2, 3]  # the list gives two sequences, EOD on the last
    assert [a[i].tolist() for i in range(3)] == [[3], [4, 5, 10], [7, 10]]


@pytest.mark.parametrize("workers,extra", [(1, []), (2, []), (1, ["--trim-max-length", "100000"])])
def test_several_keys_stay_aligned(tmp_path, workers, extra, capsys):
    """Document i of each output comes from the same input record. As in Megatron-LM, a record empty in
    one key is an empty document (no sequences, no EOD) there and keeps its other keys' text; a record
    empty in every key, or bad in one, is skipped for every key."""
    rows = [{"q": "1 2", "a": "3"}, {"q": "", "a": "4 5"}, {"q": "6", "a": ["", ""]}, {"q": "7", "a": 8},
            {"q": "9", "a": "10 11"}, {"q": ["", "12"], "a": ["13", "14"]}, {"q": "", "a": [""]}]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "o"
    assert run_tool("--input", path, "--json-keys", "q", "a", "--output-prefix", out, "--tokenizer-type",
                    "NullTokenizer", "--tokenizer-model", 100, "--append-eod", "--workers", workers,
                    "--chunk-bytes", 40, *extra) == 0
    summary = capsys.readouterr().out
    assert docs_of(str(out) + "_q_document") == [[1, 2, 100], [], [6, 100], [9, 100], [12, 100]]
    assert docs_of(str(out) + "_a_document") == [[3, 100], [4, 5, 100], [], [10, 11, 100], [13, 14, 100]]
    assert IndexedDataset(str(out) + "_a_document").document_indices.tolist() == [0, 1, 2, 2, 3, 5]
    assert "documents: 5 (from 7 records), the same records in each of the 2 outputs" in summary
    assert "tokens:    20 (uint16, vocab 101) = 9 q + 11 a" in summary
    for key, line in (("q", 2), ("a", 3)):
        empty = next(l for l in summary.splitlines() if f"no tokens in key {key!r}" in l)
        assert empty.startswith("empty:     1 records have no tokens") and empty.endswith(f"in.jsonl:{line}"), empty
    skipped = next(l for l in summary.splitlines() if l.strip().startswith("empty document"))
    assert ": 1" in skipped and skipped.endswith("in.jsonl:7 (every key)"), skipped
    assert "key 'a' is not a string: 1" in summary


def test_a_key_without_text_in_any_record_writes_nothing(tmp_path, capsys):
    """With several keys, a key empty in every record would give an output of empty documents only (a
    dataset that fails much later, in training): refused like an input without documents."""
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"q": "", "a": f"{i} {i + 1}"}) + "\n" for i in range(4)))
    assert run_tool("--input", path, "--json-keys", "q", "a", "--output-prefix", tmp_path / "o", "--tokenizer-type",
                    "NullTokenizer", "--tokenizer-model", 100) == 1
    assert "--json-keys q a: no record has text under 'q' (4 documents, every one empty there)" in \
        capsys.readouterr().err
    assert not [p for p in os.listdir(tmp_path) if p.startswith("o_")]


def test_several_keys_need_jsonl_only(tmp_path, capsys):
    (tmp_path / "a.jsonl").write_text(json.dumps({"q": "1", "a": "2"}) + "\n")
    (tmp_path / "b.txt").write_text("3 4")
    assert run_tool("--input", tmp_path / "a.jsonl", tmp_path / "b.txt", "--json-keys", "q", "a",
                    "--output-prefix", tmp_path / "o", "--tokenizer-type", "NullTokenizer",
                    "--tokenizer-model", 100) == 2
    assert "b.txt is plain text" in capsys.readouterr().err


def test_large_vocab_is_int32(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"text": "70000 5 65535"}) + "\n")
    assert run_tool("--input", path, "--output-prefix", tmp_path / "o", "--tokenizer-type", "NullTokenizer",
                    "--tokenizer-model", 70001) == 0
    ds = IndexedDataset(str(tmp_path / "o_text_document"))
    assert ds.dtype == np.int32 and ds[0].tolist() == [70000, 5, 65535]


@pytest.mark.parametrize("content", [b"", b"\n\n", b'{"text": ""}\n'])
def test_empty_input_is_an_error_without_output(tmp_path, content, capsys):
    path = tmp_path / "in.jsonl"
    path.write_bytes(content)
    assert run_tool("--input", path, "--output-prefix", tmp_path / "o", "--tokenizer-type", "NullTokenizer",
                    "--tokenizer-model", 10) == 1
    assert "no documents to write" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_bad_flags_are_clear(tmp_path, capsys):
    assert run_tool("--input", tmp_path / "missing.jsonl", "--output-prefix", tmp_path / "o",
                    "--tokenizer-type", "NullTokenizer", "--tokenizer-model", 10) == 2
    assert "missing.jsonl: no such file" in capsys.readouterr().err
    (tmp_path / "x.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd")
    try:
        import zstandard  # noqa: F401
    except ImportError:
        assert run_tool("--input", tmp_path / "x.jsonl.zst", "--output-prefix", tmp_path / "o",
                        "--tokenizer-type", "NullTokenizer", "--tokenizer-model", 10) == 2
        assert "zstandard" in capsys.readouterr().err
    (tmp_path / "s.jsonl").write_text('{"text": "1"}\n{bad\n')
    assert run_tool("--input", tmp_path / "s.jsonl", "--output-prefix", tmp_path / "o", "--strict",
                    "--tokenizer-type", "NullTokenizer", "--tokenizer-model", 10) == 2
    assert "s.jsonl:2: malformed JSON" in capsys.readouterr().err
    assert not any(f.startswith("o") for f in os.listdir(tmp_path))


def test_trimming_outcomes_are_counted(tmp_path, sp_model, capsys):
    tok = build_tokenizer("GPTSentencePieceTokenizer", sp_model)
    think = " ".join(["proment ver ex"] * 30)
    rows = ["Short question. Short answer.",
            f"Question? <think> {think} </think> Final answer.",
            " ".join(["plain filler words"] * 40)]
    max_len = 40
    assert len(tok.encode(rows[0])) + 1 <= max_len < len(tok.encode(rows[1]))
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    assert run_tool("--input", path, "--output-prefix", tmp_path / "o", "--tokenizer-type", "GPTSentencePieceTokenizer",
                    "--tokenizer-model", sp_model, "--append-eod", "--trim-max-length", max_len,
                    "--reasoning-markers", "<think>", "</think>") == 0
    out = capsys.readouterr().out
    assert "trimming:  fit 1, trimmed_last_reasoning 1, dropped_earlier_reasoning 0, answers_only 0, dropped 1" in out
    docs = docs_of(str(tmp_path / "o_text_document"))
    assert len(docs) == 2 and all(len(d) <= max_len for d in docs) and len(docs[1]) > max_len - 5
    assert tok.decode(docs[1][:-1]).endswith("</think> Final answer.")


def test_merge_datasets(tmp_path):
    parts = []
    for i in range(3):
        p = tmp_path / f"p{i}.jsonl"
        p.write_text("".join(json.dumps({"text": f"{i} {j} {j}"}) + "\n" for j in range(1, 4 + i)))
        assert run_tool("--input", p, "--output-prefix", tmp_path / "parts" / f"p{i}", "--tokenizer-type",
                        "NullTokenizer", "--tokenizer-model", 100, "--append-eod") == 0
        parts.append(str(tmp_path / "parts" / f"p{i}_text_document"))
    assert MERGE.main(["--input", str(tmp_path / "parts"), "--output-prefix", str(tmp_path / "m")]) == 0
    assert docs_of(str(tmp_path / "m")) == [d for p in parts for d in docs_of(p)]
    assert MERGE.main(["--input", parts[0] + ".idx", parts[2], "--output-prefix", str(tmp_path / "m2")]) == 0
    assert docs_of(str(tmp_path / "m2")) == docs_of(parts[0]) + docs_of(parts[2])
    assert MERGE.main(["--input", str(tmp_path / "nothing"), "--output-prefix", str(tmp_path / "m3")]) == 2
    # the same input twice: its documents twice, and its tokenizer record kept (a repeated input was counted
    # as an input without a record, and the merged dataset got none)
    assert MERGE.main(["--input", parts[1], parts[1], "--output-prefix", str(tmp_path / "twice")]) == 0
    assert docs_of(str(tmp_path / "twice")) == docs_of(parts[1]) * 2
    assert (tmp_path / "twice.tokenizer.json").exists()


def test_vectorized_and_list_paths_agree(tmp_path, sp_model, corpus_dir):
    """No trimming -> vectorized path; trimming with a huge limit -> per-document path. Same bytes."""
    path = tmp_path / "in.jsonl"
    rows = [json.loads(l) for l in open(corpus_dir / "train.jsonl")][:80]
    rows[5]["text"] = ""
    rows[9]["text"] = "caf\u00e9 \u2603 mixed"
    rows[11]["text"] = ["two", "", "sentences"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    outs = []
    for extra in ([], ["--trim-max-length", "100000"]):
        prefix = tmp_path / f"o{len(extra)}"
        assert run_tool("--input", path, "--output-prefix", prefix, "--tokenizer-type", "GPTSentencePieceTokenizer",
                        "--tokenizer-model", sp_model, "--append-eod", "--chunk-bytes", 5000, *extra) == 0
        outs.append([open(f"{prefix}_text_document{e}", "rb").read() for e in (".bin", ".idx")])
    assert outs[0] == outs[1]
    ds = IndexedDataset(str(tmp_path / "o0_text_document"))
    assert ds.num_documents == 79 and ds.document_indices[10] + 2 == ds.document_indices[11]  # row 11 -> doc 10 (row 5 skipped)


def test_progress_bar_and_log_lines(tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"text": f"{i} {i} {i}"}) + "\n" for i in range(50)))
    common = dict(input=[str(path)], tokenizer_type="NullTokenizer", tokenizer_model="100", chunk_bytes=300)
    pre.run(pre.PreprocessConfig(output_prefix=str(tmp_path / "a"), progress=True, **common))
    err = capsys.readouterr().err
    assert "tokenizing" in err and "docs/s" in err and "M tok/s" in err
    pre.run(pre.PreprocessConfig(output_prefix=str(tmp_path / "b"), progress=False, log_interval=20, **common))
    lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("processed")]
    assert len(lines) >= 2 and "documents" in lines[0] and "tokens/s" in lines[0]


def test_huggingface_tokenizer_preprocessing(tmp_path, hf_tokenizer_dir, corpus_dir):
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(hf_tokenizer_dir / "tokenizer.json"))
    texts = [json.loads(l)["text"] for l in open(corpus_dir / "train.jsonl")][:30]
    assert run_tool("--input", corpus_dir / "train.jsonl", "--output-prefix", tmp_path / "o", "--tokenizer-type",
                    "HuggingFaceTokenizer", "--tokenizer-model", hf_tokenizer_dir, "--append-eod", "--workers", 2) == 0
    docs = docs_of(str(tmp_path / "o_text_document"))
    eos = hf.token_to_id("<eos>")
    assert docs[:30] == [hf.encode(t).ids + [eos] for t in texts]  # <bos> from the post-processor, EOD = <eos>


def test_gpt2_bpe_preprocessing_with_megatron_flags(tmp_path, gpt2_files, corpus_dir):
    vocab, merges = gpt2_files
    tok = build_tokenizer("GPT2BPETokenizer", None, vocab_file=str(vocab), merge_file=str(merges))
    texts = [json.loads(l)["text"] for l in open(corpus_dir / "train.jsonl")]
    assert run_tool("--input", corpus_dir / "train.jsonl", "--output-prefix", tmp_path / "o", "--tokenizer-type",
                    "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges, "--append-eod",
                    "--workers", 2, "--partitions", 2, "--keep-sequential-samples", "--keep-newlines") == 0
    assert docs_of(str(tmp_path / "o_text_document")) == [tok.encode(t) + [tok.eod] for t in texts]
    with pytest.raises(SystemExit):        # sentence splitting is refused, naming the flag
        run_tool("--input", corpus_dir / "train.jsonl", "--output-prefix", tmp_path / "s", "--tokenizer-type",
                 "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges, "--split-sentences")
    assert not (tmp_path / "s_text_document.bin").exists()


def test_llama2_preprocessing_puts_bos_before_every_document(tmp_path, sp_model, corpus_dir):
    sp = spm.SentencePieceProcessor(model_file=sp_model)
    texts = [json.loads(l)["text"] for l in open(corpus_dir / "train.jsonl")]
    assert run_tool("--input", corpus_dir / "train.jsonl", "--output-prefix", tmp_path / "o", "--tokenizer-type",
                    "Llama2Tokenizer", "--tokenizer-model", sp_model, "--append-eod") == 0
    expected = [[sp.bos_id()] + sp.encode(t) + [sp.eos_id()] for t in texts]
    assert docs_of(str(tmp_path / "o_text_document")) == expected


def test_peak_memory_does_not_grow_with_input(tmp_path, sp_model, monkeypatch):
    """Python/numpy peak allocations while preprocessing 4x more input stay the same (streaming).
    The word cache is capped (1M words by default); a small cap here makes the bound visible."""
    import tracemalloc

    from megatron_zaya.data.synthetic import write_jsonl
    from megatron_zaya.data.tokenizer import GPTSentencePieceTokenizer

    monkeypatch.setattr(GPTSentencePieceTokenizer, "_CACHE_LIMIT", 3000)

    peaks = []
    for n_docs in (150, 600):
        path = tmp_path / f"in{n_docs}.jsonl"
        write_jsonl(str(path), n_docs, seed=n_docs, max_sentences=10)
        cfg = pre.PreprocessConfig(input=[str(path)], output_prefix=str(tmp_path / f"o{n_docs}"),
                                   tokenizer_type="GPTSentencePieceTokenizer", tokenizer_model=sp_model,
                                   append_eod=True, chunk_bytes=32 << 10, progress=False)
        tracemalloc.start()
        s = pre.run(cfg)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert s["documents"] == n_docs
    input_growth = os.path.getsize(tmp_path / "in600.jsonl") - os.path.getsize(tmp_path / "in150.jsonl")
    # holding the tokens (uint16) of the extra input alone would add ~0.5 x input_growth
    assert peaks[1] - peaks[0] < 0.25 * input_growth, (peaks, input_growth)


def test_zstd_input(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    path = tmp_path / "in.jsonl.zst"
    raw = "".join(json.dumps({"text": f"{i} {i + 1}"}) + "\n" for i in range(300)).encode()
    path.write_bytes(zstandard.ZstdCompressor().compress(raw))
    assert run_tool("--input", path, "--output-prefix", tmp_path / "o", "--tokenizer-type", "NullTokenizer",
                    "--tokenizer-model", 1000, "--append-eod") == 0
    assert docs_of(str(tmp_path / "o_text_document")) == [[i, i + 1, 1000] for i in range(300)]
    # several frames (files concatenated with cat, or written by a parallel compressor): all of them
    half = raw.index(b"\n", len(raw) // 2) + 1
    path.write_bytes(zstandard.ZstdCompressor().compress(raw[:half]) + zstandard.ZstdCompressor().compress(raw[half:]))
    assert run_tool("--input", path, "--output-prefix", tmp_path / "o2", "--tokenizer-type", "NullTokenizer",
                    "--tokenizer-model", 1000, "--append-eod") == 0
    assert docs_of(str(tmp_path / "o2_text_document")) == [[i, i + 1, 1000] for i in range(300)]


def _truncated_zstd(raw):
    zstandard = pytest.importorskip("zstandard")
    data = zstandard.ZstdCompressor().compress(raw)
    return data[:len(data) // 2]          # zstandard's stream_reader stopped there without an error: exit 0


@pytest.mark.parametrize("workers", [1, 2])
def test_hostile_json_is_skipped_with_line_numbers(tmp_path, workers, capsys):
    path = tmp_path / "in.jsonl"
    lines = [json.dumps({"text": "1 2"}),
             '{"text": "3 \\ud800 4"}',                                  # line 2: lone surrogate (\u escape)
             '{"text": "5", "x": ' + "[" * 100000 + "]" * 100000 + "}",   # line 3: nested too deeply
             '{"text": "6", "n": ' + "9" * 5000 + "}",                   # line 4: integer over the digit limit
             '{"text": ["7", "\\udfff"]}',                               # line 5: lone surrogate in a list
             '{"text": "8", "note": "\\ud83d\\ude00 \\ud800"}',          # other keys are not checked
             '{"text": "9 10"}']
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "o"
    assert run_tool("--input", path, "--output-prefix", out, "--tokenizer-type", "NullTokenizer",
                    "--tokenizer-model", 100, "--workers", workers, "--chunk-bytes", 64) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert docs_of(str(out) + "_text_document") == [[1, 2], [8], [9, 10]]
    summary = captured.out
    assert "documents: 3 (from 7 records)" in summary and "skipped:   4" in summary
    bad_json = next(l for l in summary.splitlines() if l.strip().startswith("malformed JSON"))
    assert ": 2" in bad_json and "in.jsonl:3 (nested too deeply)" in bad_json and "in.jsonl:4 (" in bad_json
    assert "digits" in bad_json
    bad_uni = next(l for l in summary.splitlines() if l.strip().startswith("invalid Unicode"))
    assert ": 2" in bad_uni and "in.jsonl:2 (lone surrogate in key 'text')" in bad_uni and "in.jsonl:5" in bad_uni


def test_lone_surrogate_is_an_error_in_strict_mode(tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "1"}\n{"text": "\\ud800"}\n')
    assert run_tool("--input", path, "--output-prefix", tmp_path / "o", "--tokenizer-type", "NullTokenizer",
                    "--tokenizer-model", 100, "--strict") == 2
    err = capsys.readouterr().err
    assert "in.jsonl:2: invalid Unicode" in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def _corrupt_gzip(raw):
    data = bytearray(gzip.compress(raw))
    data[20:32] = b"x" * 12   # inside the deflate stream: zlib.error, not an OSError
    return bytes(data)


def _corrupt_zstd(raw):
    zstandard = pytest.importorskip("zstandard")
    data = zstandard.ZstdCompressor().compress(raw)
    return data[:30] + b"x" * 40 + data[70:]


@pytest.mark.parametrize("name,make", [
    ("in.jsonl.gz", _corrupt_gzip),
    ("in.jsonl.gz", lambda raw: b"not gzip at all"),
    ("in.jsonl.gz", lambda raw: gzip.compress(raw)[:-30]),      # truncated
    ("in.jsonl.zst", _corrupt_zstd),
    ("in.jsonl.zst", lambda raw: pytest.importorskip("zstandard") and b"not zstd at all"),
    ("in.jsonl.zst", _truncated_zstd),
])
@pytest.mark.parametrize("workers", [1, 2])
def test_corrupt_compressed_input_is_an_input_error(tmp_path, name, make, workers, capsys):
    raw = "".join(json.dumps({"text": f"{i} {i + 1}"}) + "\n" for i in range(3000)).encode()
    path = tmp_path / name
    path.write_bytes(make(raw))
    assert run_tool("--input", path, "--output-prefix", tmp_path / "o", "--tokenizer-type", "NullTokenizer",
                    "--tokenizer-model", 10000, "--workers", workers) == 2
    err = capsys.readouterr().err
    assert f"--input {path}: read failed" in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == [name]


def _write_parquet(path, rows, row_group_size=37):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), str(path), row_group_size=row_group_size)


@pytest.mark.parametrize("workers", [1, 2])
def test_parquet_input_gives_the_bytes_of_the_same_jsonl(tmp_path, sp_model, corpus_dir, workers, capsys):
    """A Parquet corpus (text plus other columns, one a timestamp, several row groups and row batches)
    gives exactly the .bin/.idx of the same rows as JSONL; a null text is skipped and reported by row."""
    import datetime

    texts = [json.loads(l)["text"] for l in open(corpus_dir / "train.jsonl")]
    rows = [{"text": t, "id": i, "url": f"https://example.com/{i}", "date": datetime.datetime(2024, 1, 1 + i % 28)}
            for i, t in enumerate(texts)]
    rows[41]["text"] = None
    folder = tmp_path / "shards"
    folder.mkdir()
    _write_parquet(folder / "part-0.parquet", rows[:150])
    _write_parquet(folder / "part-1.parquet", rows[150:])
    jsonl = tmp_path / "same.jsonl"
    jsonl.write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in rows))
    outputs = []
    for name, source in (("parquet", folder), ("jsonl", jsonl)):
        assert run_tool("--input", source, "--output-prefix", tmp_path / name, "--tokenizer-type",
                        "GPTSentencePieceTokenizer", "--tokenizer-model", sp_model, "--append-eod",
                        "--workers", workers, "--chunk-bytes", 20000) == 0
        outputs.append([(tmp_path / f"{name}_text_document{ext}").read_bytes() for ext in (".bin", ".idx")])
        if name == "parquet":
            out = capsys.readouterr()
            assert "taking 2 corpus file(s)" in out.err
            bad = next(l for l in out.out.splitlines() if l.strip().startswith("key 'text' is not a string"))
            assert ": 1" in bad and "part-0.parquet:42" in bad, bad
    assert outputs[0] == outputs[1]
    assert IndexedDataset(str(tmp_path / "parquet_text_document")).num_documents == 299


def test_parquet_columns_as_several_keys_and_a_missing_column(tmp_path, capsys):
    path = tmp_path / "qa.parquet"
    _write_parquet(path, [{"q": "1 2", "a": "3", "other": 0}, {"q": "4", "a": "5 6", "other": 1}], row_group_size=1)
    assert run_tool("--input", path, "--json-keys", "q", "a", "--output-prefix", tmp_path / "o",
                    "--tokenizer-type", "NullTokenizer", "--tokenizer-model", 10, "--append-eod") == 0
    assert docs_of(str(tmp_path / "o_q_document")) == [[1, 2, 10], [4, 10]]
    assert docs_of(str(tmp_path / "o_a_document")) == [[3, 10], [5, 6, 10]]
    capsys.readouterr()
    # A column no row can have is a wrong --json-keys: said at start, with the file's columns.
    assert run_tool("--input", path, "--json-keys", "q", "body", "--output-prefix", tmp_path / "p",
                    "--tokenizer-type", "NullTokenizer", "--tokenizer-model", 10) == 2
    err = capsys.readouterr().err
    assert f"--json-keys body: no such column in {path} (its columns: q, a, other)" in err
    assert not list(tmp_path.glob("p_*"))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_file_named_parquet_that_is_not_is_an_input_error(tmp_path, workers, capsys):
    pytest.importorskip("pyarrow")
    path = tmp_path / "in.parquet"
    path.write_text(json.dumps({"text": "1 2"}) + "\n")
    assert run_tool("--input", path, "--output-prefix", tmp_path / "o", "--tokenizer-type", "NullTokenizer",
                    "--tokenizer-model", 10, "--workers", workers) == 2
    err = capsys.readouterr().err
    assert f"--input {path}: not a readable Parquet file" in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["in.parquet"]


def test_parquet_without_pyarrow_names_the_package(tmp_path, monkeypatch, capsys):
    import sys

    path = tmp_path / "in.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)     # import pyarrow.parquet -> ImportError
    assert run_tool("--input", path, "--output-prefix", tmp_path / "o", "--tokenizer-type", "NullTokenizer",
                    "--tokenizer-model", 10) == 2
    assert "needs the optional package 'pyarrow'" in capsys.readouterr().err


def test_train_tokenizer_reads_parquet(tmp_path, corpus_dir):
    """tools/train_tokenizer.py takes the same Parquet corpus as preprocess_data.py: the same model as
    from the JSONL of its text column."""
    texts = [json.loads(l)["text"] for l in open(corpus_dir / "train.jsonl")]
    _write_parquet(tmp_path / "c.parquet", [{"id": i, "text": t} for i, t in enumerate(texts)])
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tool = load_tool("train_tokenizer")
    for name in ("c.parquet", "c.jsonl"):
        assert tool.main(["--input", str(tmp_path / name), "--vocab-size", "400", "--output-prefix",
                          str(tmp_path / name.replace(".", "_")), "--num-threads", "1"]) == 0
    assert (tmp_path / "c_parquet.vocab").read_text() == (tmp_path / "c_jsonl.vocab").read_text()
    assert tool.main(["--input", str(tmp_path / "c.parquet"), "--json-keys", "body", "--vocab-size", "400",
                      "--output-prefix", str(tmp_path / "x"), "--num-threads", "1"]) == 2


def test_parquet_reading_holds_one_row_group_at_a_time(tmp_path):
    """Arrow memory while reading an 8-row-group file stays well under the file's data (pyarrow's
    pre-buffering kept ranges of up to 32 MB of row groups read, until the file closed: here the whole
    file, in a 43 MB-row-group corpus +23 MB per row group)."""
    pa = pytest.importorskip("pyarrow")
    import random

    from megatron_zaya.data.sources import iter_records

    generator = random.Random(0)
    texts = [" ".join(f"{generator.getrandbits(64):x}" for _ in range(100)) for _ in range(8 * 1500)]   # ~1.7 KB each
    path = tmp_path / "big.parquet"
    _write_parquet(path, [{"text": t} for t in texts], row_group_size=1500)
    total = sum(len(t) for t in texts)
    del texts
    peak = rows = 0
    for _ in iter_records([str(path)], columns=["text"]):
        rows += 1
        peak = max(peak, pa.total_allocated_bytes())
    assert rows == 8 * 1500
    assert peak < total / 2, (peak, total)
