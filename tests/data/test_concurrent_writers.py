"""Two runs writing the same output at once (a job submitted twice, on one machine or on two sharing the folder):
neither removes the other's live temporary files, and they never both report success nor leave a mixed output."""

import json
import os
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


# Two runs writing one output: temporary names of their own ------------------------------------------------------

def test_processes_of_one_id_on_two_machines_have_their_own_temporary_files():
    """Containers on two machines number their processes alike; the temporary files were PREFIX.bin.tmpPID, so
    two preprocess runs of one output with the same process id wrote into the same files (a corrupt dataset)."""
    code = ("import os; os.getpid = lambda: 4242; from megatron_zaya.data.indexed import temporary_paths; "
            "print(temporary_paths('/x/o_text_document')[0])")
    names = [subprocess.run([sys.executable, "-c", code], check=True, timeout=60, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": REPO}).stdout.strip() for _ in range(2)]
    assert names[0] != names[1] and all(n.startswith("/x/o_text_document.bin.tmp4242-") for n in names), names
