"""Two runs writing the same output at once (a job submitted twice, on one machine or on two sharing the folder):
neither removes the other's live temporary files, and they never both report success nor leave a mixed output."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from data_test_utils import load_tool
from megatron_zaya import leftovers

TRAIN = load_tool("train_tokenizer")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def tok_corpus(tmp_path_factory):
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex".split()
    path = tmp_path_factory.mktemp("tok") / "c.jsonl"
    path.write_text("".join(json.dumps({"text": " ".join(words[i % 7:] + words[: i % 5])}) + "\n" for i in range(200)))
    return path


def _train(inp, prefix, *extra):
    return TRAIN.main(["--input", str(inp), "--vocab-size", "300", "--output-prefix", str(prefix),
                       "--num-threads", "1", *extra])


def _sweep_from_another_machine(folder: str, output: str) -> str:
    """What a second train_tokenizer.py of `output` on another machine does first: remove the hidden folders of
    writers whose process it cannot see (none is visible from there) and that have been quiet for QUIET_SECONDS;
    returns its log."""
    hidden = f".{os.path.basename(output)}.train_tokenizer.tmp"
    code = ("import re, sys; from megatron_zaya import leftovers as L; L.process_running = lambda pid: False; "
            "L.remove_leftovers(sys.argv[1], re.compile(re.escape(sys.argv[2]) + r'(?P<pid>\\d+)-\\w+'), sys.argv[3])")
    return subprocess.run([sys.executable, "-c", code, folder, hidden, output], check=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True).stderr


@pytest.mark.parametrize("model_type", ["bpe", "tiktoken"])
def test_a_training_runs_folder_is_not_removed_by_a_run_on_another_machine(tmp_path, tok_corpus, monkeypatch,
                                                                          capsys, model_type):
    """The hidden working folder stays empty while the tokenizer trains (written only at the end); a run of the same
    output on another machine, where this process is not visible, removed it once quiet for 10 minutes and this
    run then failed at the end (NOT_FOUND ... sp.model). A live run touches it every HEARTBEAT_SECONDS: here the
    folder is made 11 minutes old as training starts, and the heartbeat (every 0.02 s) makes it recent again."""
    import sentencepiece as spm
    monkeypatch.setattr(leftovers, "HEARTBEAT_SECONDS", 0.02)
    prefix, swept = str(tmp_path / "sp"), []

    def long_training(folder):
        old = time.time() - leftovers.QUIET_SECONDS - 60
        os.utime(folder, (old, old))
        deadline = time.time() + 3
        while os.stat(folder).st_mtime == old and time.time() < deadline:
            time.sleep(0.01)
        swept.append(_sweep_from_another_machine(str(tmp_path), prefix))

    if model_type == "tiktoken":
        real_tiktoken = TRAIN.train_tiktoken

        def train_tiktoken(args, lines, tmp_prefix):
            long_training(os.path.dirname(tmp_prefix))
            return real_tiktoken(args, lines, tmp_prefix)
        monkeypatch.setattr(TRAIN, "train_tiktoken", train_tiktoken)
    else:
        real_train = spm.SentencePieceTrainer.Train

        def train(**kwargs):
            long_training(os.path.dirname(kwargs["model_prefix"]))
            return real_train(**kwargs)
        monkeypatch.setattr(spm.SentencePieceTrainer, "Train", train)
    assert _train(tok_corpus, prefix, "--model-type", model_type) == 0, capsys.readouterr().err
    assert "left 1 temporary file(s)" in swept[0], swept     # the sweep saw a live run's folder
    names = ["sp.json"] if model_type == "tiktoken" else ["sp.model", "sp.vocab"]
    assert sorted(os.listdir(tmp_path)) == names


def test_kept_fresh_touches_until_the_block_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(leftovers, "HEARTBEAT_SECONDS", 0.01)
    old = time.time() - 3600
    os.utime(tmp_path, (old, old))
    with leftovers.kept_fresh(str(tmp_path)):
        deadline = time.time() + 3
        while os.stat(tmp_path).st_mtime == old and time.time() < deadline:
            time.sleep(0.005)
        assert os.stat(tmp_path).st_mtime > old
    os.utime(tmp_path, (old, old))
    time.sleep(0.05)
    assert os.stat(tmp_path).st_mtime == old            # the heartbeat stopped with the block


# Two runs writing one output: temporary names of their own, and no second run replacing the first's output -------

PRE = load_tool("preprocess_data")
MERGE = load_tool("merge_datasets")


def _files(prefix):
    return {ext: open(prefix + ext, "rb").read() for ext in (".bin", ".idx")}


def test_processes_of_one_id_on_two_machines_have_their_own_temporary_files():
    """Containers on two machines number their processes alike; the temporary files were PREFIX.bin.tmpPID, so
    two preprocess runs of one output with the same process id wrote into the same files (a corrupt dataset)."""
    code = ("import os; os.getpid = lambda: 4242; from megatron_zaya.data.indexed import temporary_paths; "
            "print(temporary_paths('/x/o_text_document')[0])")
    names = [subprocess.run([sys.executable, "-c", code], check=True, timeout=60, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": REPO}).stdout.strip() for _ in range(2)]
    assert names[0] != names[1] and all(n.startswith("/x/o_text_document.bin.tmp4242-") for n in names), names


def test_two_writers_of_one_prefix_at_once_leave_the_first_ones_dataset(tmp_path, monkeypatch):
    """Two writers of one prefix, of one process id on two machines (another token), interleaved: the first to
    commit writes the dataset whole; the second, which does not replace (no --overwrite), gets FileExistsError
    naming the .bin, and its abort() leaves the first's pair and no temporary file."""
    from megatron_zaya.data.indexed import IndexedDataset, IndexedDatasetWriter
    prefix = str(tmp_path / "o_text_document")
    first = IndexedDatasetWriter(prefix)
    monkeypatch.setattr(leftovers, "_PROCESS_TOKEN", "0ther")
    second = IndexedDatasetWriter(prefix)
    for i in range(50):
        first.add_document([1, 2, i])
        second.add_document([7] * 5)
    first.prepare()
    second.prepare()
    first.commit(replace=False)
    with pytest.raises(FileExistsError) as err:
        second.commit(replace=False)
    assert err.value.filename == prefix + ".bin"
    second.abort()
    ds = IndexedDataset(prefix)
    assert [ds.document(i).tolist() for i in range(ds.num_documents)] == [[1, 2, i] for i in range(50)]
    assert sorted(os.listdir(tmp_path)) == ["o_text_document.bin", "o_text_document.idx"]


@pytest.mark.parametrize("hard_links", [True, False])
def test_put_in_place_takes_back_what_it_put_when_a_later_name_exists(tmp_path, monkeypatch, hard_links):
    """A pair stays one run's: the .idx's name taken, the .bin this call linked (or, on a file system without
    hard links, renamed) is taken back."""
    from megatron_zaya.publish import put_in_place
    if not hard_links:
        def no_links(src, dst):
            raise PermissionError(1, "Operation not permitted", src)
        monkeypatch.setattr(os, "link", no_links)
    for name, text in (("a.bin.tmp", "mine"), ("a.idx.tmp", "mine"), ("a.idx", "theirs")):
        (tmp_path / name).write_text(text)
    with pytest.raises(FileExistsError) as err:
        put_in_place([(str(tmp_path / "a.bin.tmp"), str(tmp_path / "a.bin")),
                      (str(tmp_path / "a.idx.tmp"), str(tmp_path / "a.idx"))], replace=False)
    assert err.value.filename == str(tmp_path / "a.idx")
    assert sorted(os.listdir(tmp_path)) == ["a.bin.tmp", "a.idx", "a.idx.tmp"]
    assert (tmp_path / "a.idx").read_text() == "theirs"


def test_put_in_place_without_hard_links_still_refuses_an_existing_name(tmp_path, monkeypatch):
    from megatron_zaya.publish import put_in_place

    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted", src)
    monkeypatch.setattr(os, "link", no_links)
    (tmp_path / "a.tmp").write_text("new")
    (tmp_path / "b.tmp").write_text("new")
    (tmp_path / "b").write_text("theirs")
    put_in_place([(str(tmp_path / "a.tmp"), str(tmp_path / "a"))], replace=False)
    with pytest.raises(FileExistsError):
        put_in_place([(str(tmp_path / "b.tmp"), str(tmp_path / "b"))], replace=False)
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "b.tmp"] and (tmp_path / "b").read_text() == "theirs"


@pytest.fixture
def other_runs_dataset(tmp_path_factory):
    """A dataset, with its tokenizer record, that "another run" puts at this run's output while it works."""
    from megatron_zaya.data.indexed import write_dataset
    prefix = str(tmp_path_factory.mktemp("other") / "o_text_document")
    write_dataset(prefix, [[9, 9, 9]])
    with open(prefix + ".tokenizer.json", "w") as f:
        f.write("{}\n")
    return prefix


def _written_by_the_other_run_during_prepare(monkeypatch, other, output):
    """Hooks IndexedDatasetWriter.prepare: the other run's files appear at `output` between this run's start
    check and its commit."""
    from megatron_zaya.data.indexed import IndexedDatasetWriter
    real = IndexedDatasetWriter.prepare

    def prepare(self):
        real(self)
        for ext in (".bin", ".idx", ".tokenizer.json"):
            shutil.copyfile(other + ext, output + ext)
    monkeypatch.setattr(IndexedDatasetWriter, "prepare", prepare)


@pytest.mark.parametrize("overwrite", [False, True])
def test_preprocess_does_not_replace_an_output_another_run_wrote_meanwhile(tmp_path, monkeypatch, capsys,
                                                                         other_runs_dataset, overwrite):
    """Without --overwrite, the second of two runs of one output (a job submitted twice) exited 0 saying "wrote:"
    and had replaced the first's output: now one line naming the file, exit 2, the other run's files untouched and
    no temporary file left. With --overwrite it replaces the output, as asked."""
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"text": "1 2 3"}) + "\n" for _ in range(10)))
    out = str(tmp_path / "o")
    _written_by_the_other_run_during_prepare(monkeypatch, other_runs_dataset, out + "_text_document")
    status = PRE.main(["--input", str(inp), "--output-prefix", out, "--tokenizer-type", "NullTokenizer",
                       "--tokenizer-model", "100", "--no-progress"] + (["--overwrite"] if overwrite else []))
    err = capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "o_text_document.bin", "o_text_document.idx",
                                            "o_text_document.tokenizer.json"]
    theirs = _files(other_runs_dataset)
    if overwrite:
        assert status == 0 and _files(out + "_text_document") != theirs
        return
    assert status == 2
    assert err.strip().splitlines()[-1] == (f"error: --output-prefix {out}: {out}_text_document.bin was written "
                                            f"meanwhile by another run (pass --overwrite to replace it)")
    assert _files(out + "_text_document") == theirs
    assert open(out + "_text_document.tokenizer.json").read() == "{}\n"


def test_merge_does_not_replace_an_output_another_run_wrote_meanwhile(tmp_path, monkeypatch, capsys,
                                                                      other_runs_dataset):
    from megatron_zaya.data.indexed import write_dataset
    write_dataset(str(tmp_path / "a"), [[1, 2]])
    out = str(tmp_path / "m")
    _written_by_the_other_run_during_prepare(monkeypatch, other_runs_dataset, out)
    assert MERGE.main(["--input", str(tmp_path / "a"), "--output-prefix", out]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --output-prefix {out}: {out}.bin was written meanwhile by another run (pass --overwrite to "
        f"replace it)")
    assert _files(out) == _files(other_runs_dataset)
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "a.idx", "m.bin", "m.idx", "m.tokenizer.json"]


@pytest.mark.parametrize("model_type", ["bpe", "tiktoken"])
def test_train_tokenizer_does_not_replace_a_tokenizer_another_run_wrote_meanwhile(tmp_path, tok_corpus, monkeypatch,
                                                                                  capsys, model_type):
    """Two runs of one output without --overwrite both exited 0, the second replacing the first's tokenizer: now
    the second says so in one line (exit 2), the first's files stay and no hidden folder is left."""
    names = ["sp.json"] if model_type == "tiktoken" else ["sp.model", "sp.vocab"]
    real = TRAIN._install

    def install(*args, **kwargs):
        for name in names:
            (tmp_path / name).write_text("the other run's")
        return real(*args, **kwargs)
    monkeypatch.setattr(TRAIN, "_install", install)
    assert _train(tok_corpus, tmp_path / "sp", "--model-type", model_type) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --output-prefix {tmp_path / 'sp'}: {tmp_path / names[-1]} was written meanwhile by another run "
        f"(pass --overwrite to replace it)")
    assert sorted(os.listdir(tmp_path)) == names
    assert all((tmp_path / name).read_text() == "the other run's" for name in names)
