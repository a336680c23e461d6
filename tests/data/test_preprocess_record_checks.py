"""preprocess.run on hand-written JSONL with NullTokenizer (text = token ids): which records are skipped and
why, the vocabulary bound, the record an error names, and multi-key trimming (a record trimmed away in
one key leaves every output). Expected values are written out by hand.

    python -m pytest -q tests/data/test_preprocess_record_checks.py
"""
import json

import pytest

from megatron_zaya.data import preprocess as pre
from megatron_zaya.data.indexed import IndexedDataset


def write_jsonl(path, lines):
    with open(path, "w") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return str(path)


def run(tmp_path, lines, **kw):
    path = write_jsonl(tmp_path / "in.jsonl", lines)
    cfg = pre.PreprocessConfig(input=[path], output_prefix=str(tmp_path / "out"), tokenizer_type="NullTokenizer",
                               tokenizer_model=kw.pop("vocab", "100"), progress=False, **kw)
    return pre.run(cfg)


def docs(tmp_path, key="text"):
    ds = IndexedDataset(str(tmp_path / f"out_{key}_document"))
    return [ds.document(i).tolist() for i in range(ds.num_documents)]


def test_json_values_that_are_not_objects_are_skipped(tmp_path):
    # A scalar, a string holding the key's name and an array: none is a JSON object.
    s = run(tmp_path, ['{"text": "1 2"}', "42", '"context"', '["text"]', '{"text": "3"}'])
    assert s["skipped"] == {"not a JSON object": 3}
    assert [e.rsplit(":", 1)[1] for e in s["skip_examples"]["not a JSON object"]] == ["2", "3", "4"]
    assert docs(tmp_path) == [[1, 2], [3]]


def test_a_sentence_list_with_a_non_string_is_skipped(tmp_path):
    s = run(tmp_path, [{"text": ["1", "2"]}, {"text": ["3", 4]}, {"text": "5"}])
    assert s["skipped"] == {"key 'text' is not a string": 1}
    assert docs(tmp_path) == [[1, 2], [5]]


@pytest.mark.parametrize("trim", [None, 100])
def test_an_empty_list_of_sentences_is_an_empty_document_with_or_without_trimming(tmp_path, trim):
    """{"text": []}: skipped as an empty document; with --trim-max-length it stopped the run (IndexError)."""
    s = run(tmp_path, [{"text": "1 2 3"}, {"text": []}], trim_max_length=trim)
    assert s["documents"] == 1 and s["skipped"] == {"empty document": 1}
    assert docs(tmp_path) == [[1, 2, 3]]


def test_the_first_missing_key_is_named(tmp_path):
    s = run(tmp_path, [{"a": "1", "b": "2"}, {"other": "3"}], json_keys=["a", "b"])
    assert s["skipped"] == {"missing key 'a'": 1}


def test_at_most_five_locations_are_remembered_per_reason(tmp_path):
    s = run(tmp_path, ["{broken"] * 7 + ['{"text": "1"}'])
    assert s["skipped"] == {"malformed JSON": 7}
    lines = [e.split(" ")[0].rsplit(":", 1)[1] for e in s["skip_examples"]["malformed JSON"]]
    assert lines == ["1", "2", "3", "4", "5"]


def test_the_last_id_of_the_vocabulary_is_accepted_and_the_next_refused(tmp_path):
    # NullTokenizer with --tokenizer-model 100: ids 0..99 and the EOD 100, so 101 ids in all.
    s = run(tmp_path, ['{"text": "0 100"}'])
    assert s["vocab_size"] == 101 and docs(tmp_path) == [[0, 100]]
    (tmp_path / "bad").mkdir()
    with pytest.raises(ValueError, match=r"in\.jsonl:1: token id 101 is outside the vocabulary \[0, 100\]"):
        run(tmp_path / "bad", ['{"text": "5 101"}'])


def test_an_out_of_vocabulary_id_names_its_own_record(tmp_path):
    # The bad id is the first token of record 2 (line 2): it must not be blamed on record 1.
    with pytest.raises(ValueError, match=r"in\.jsonl:2: token id 500 is outside"):
        run(tmp_path, ['{"text": "1 2 3"}', '{"text": "500 4"}', '{"text": "5"}'])


def test_a_record_trimmed_away_in_one_key_leaves_every_output(tmp_path):
    # --trim-max-length 3: key b of record 2 is 5 tokens without reasoning markers, so trimming drops it;
    # record 2 then leaves key a's output too (the outputs stay aligned document by document).
    s = run(tmp_path, [{"a": "1 2", "b": "3"}, {"a": "4 5", "b": "6 7 8 9 10"}, {"a": "11", "b": "12 13"}],
            json_keys=["a", "b"], trim_max_length=3)
    assert docs(tmp_path, "a") == [[1, 2], [11]]
    assert docs(tmp_path, "b") == [[3], [12, 13]]
    assert s["documents"] == 2 and s["tokens_per_key"] == {"a": 3, "b": 3}


def config(tmp_path, **kw):
    return pre.PreprocessConfig(input=["unused"], output_prefix=str(tmp_path / "o"), tokenizer_type="NullTokenizer",
                                tokenizer_model="100", **kw)


@pytest.mark.parametrize("field,value,flag", [("workers", 0, "--workers"), ("vocab_extra_ids", -1, "--vocab-extra-ids"),
                                              ("chunk_bytes", 0, "--chunk-bytes"),
                                              ("trim_max_length", 0, "--trim-max-length")])
def test_the_smallest_invalid_values_are_refused(tmp_path, field, value, flag):
    with pytest.raises(ValueError, match=flag):
        pre.check_config(config(tmp_path, **{field: value}))
    pre.check_config(config(tmp_path, **{field: value + 1}))


def test_the_recorded_flags_hold_absolute_paths_and_the_extra_ids(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tok").mkdir()
    cfg = pre.PreprocessConfig(input=[], output_prefix="o", tokenizer_type="HuggingFaceTokenizer",
                               tokenizer_model="tok")
    assert pre.recorded_flags(cfg) == {"--tokenizer-type": "HuggingFaceTokenizer",
                                       "--tokenizer-model": str(tmp_path / "tok")}
    cfg = pre.PreprocessConfig(input=[], output_prefix="o", tokenizer_type="HuggingFaceTokenizer",
                               tokenizer_model="missing", vocab_extra_ids=3)
    assert pre.recorded_flags(cfg) == {"--tokenizer-type": "HuggingFaceTokenizer", "--tokenizer-model": "missing",
                                       "--vocab-extra-ids": 3}


def test_no_empty_key_is_reported_when_none_is_empty(tmp_path):
    s = run(tmp_path, [{"a": "1", "b": "2"}, {"a": "3", "b": ""}], json_keys=["a", "b"])
    assert s["empty_in_key"] == {"b": 1}
    (tmp_path / "x").mkdir()
    s = run(tmp_path / "x", [{"a": "1", "b": "2"}], json_keys=["a", "b"])
    assert s["empty_in_key"] == {}
    assert "empty:" not in pre.format_summary(s)


def test_the_summary_lists_the_most_frequent_skip_reason_first(tmp_path):
    s = run(tmp_path, ["{bad", "42", "{bad", '{"text": "1"}', "{bad"])
    lines = pre.format_summary(s).splitlines()
    at = lines.index("skipped:   4")
    assert lines[at + 1].startswith("  malformed JSON: 3") and lines[at + 2].startswith("  not a JSON object: 1"), lines


@pytest.mark.parametrize("tokenizer_type,trim", [("Llama2Tokenizer", None), ("Llama2Tokenizer", 1000),
                                                 ("HuggingFaceTokenizer", None)])
def test_a_record_holding_only_the_tokenizers_bos_is_an_empty_document(tmp_path, sp_model, hf_tokenizer_dir,
                                                                     tokenizer_type, trim):
    """Llama2Tokenizer and a tokenizer.json with a BOS post-processor make [BOS] of an empty text: such a
    record is skipped as an empty document, as with every other tokenizer (it was written as BOS + EOD).
    With --trim-max-length the records go through the per-record path, else through encode_batch_flat."""
    model = sp_model if tokenizer_type == "Llama2Tokenizer" else str(hf_tokenizer_dir)
    path = write_jsonl(tmp_path / "in.jsonl", [{"text": ""}, {"text": "hello world"}, {"text": ""}])
    cfg = pre.PreprocessConfig(input=[path], output_prefix=str(tmp_path / "out"), tokenizer_type=tokenizer_type,
                               tokenizer_model=model, append_eod=True, trim_max_length=trim, progress=False)
    s = pre.run(cfg)
    tok = pre.Encoder(cfg).tokenizer
    assert tok.encode("") == [tok.bos] and s["skipped"] == {"empty document": 2}
    assert docs(tmp_path) == [tok.encode("hello world") + [tok.eod]]


@pytest.mark.parametrize("name,text_mode,expected", [("in.jsonl", "file", [[1, 2], [3]]),
                                                     ("shard.txt", "file", [[1, 2], [3]]),    # JSONL by its content
                                                     ("in.txt", "line", [[1, 2], [3]]),
                                                     ("in.txt", "paragraph", [[1, 2, 3]]),
                                                     ("in.txt", "file", [[1, 2, 3]])])
def test_a_utf8_byte_order_mark_at_the_files_start_is_dropped(tmp_path, name, text_mode, expected):
    """A file saved with a BOM (Windows editors): its first record is read without it (JSONL's first line was
    skipped as malformed JSON, NullTokenizer refused the text's first token)."""
    lines = ['{"text": "1 2"}', '{"text": "3"}'] if name in ("in.jsonl", "shard.txt") else ["1 2", "3"]
    (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8-sig")
    s = pre.run(pre.PreprocessConfig(input=[str(tmp_path / name)], output_prefix=str(tmp_path / "out"),
                                     tokenizer_type="NullTokenizer", tokenizer_model="100", text_mode=text_mode,
                                     progress=False))
    assert s["skipped"] == {} and docs(tmp_path) == expected


def test_more_workers_than_the_machine_can_use_is_refused(tmp_path, monkeypatch):
    """--workers 100000 forked processes for minutes (deaf to SIGTERM until a chunk was done): at most four per CPU
    (64 on a small machine) are taken."""
    monkeypatch.setattr(pre.os, "cpu_count", lambda: 32)
    pre.check_config(config(tmp_path, workers=128))
    with pytest.raises(ValueError, match="--workers 129: more processes than this machine's 32 CPUs can use; "
                                         "give at most 128"):
        pre.check_config(config(tmp_path, workers=129))
    monkeypatch.setattr(pre.os, "cpu_count", lambda: 2)
    pre.check_config(config(tmp_path, workers=64))
    with pytest.raises(ValueError, match="give at most 64"):
        pre.check_config(config(tmp_path, workers=65))
