"""The temporary files of a dataset writer killed with SIGKILL are removed by the next run of the same
output (megatron_zaya/leftovers.py); a live process's, a recently changed one's and another
prefix's are left alone."""
import json
import os
import re
import signal
import subprocess
import sys
import time

from data_test_utils import ROOT, load_tool
from megatron_zaya.data.indexed import IndexedDataset, remove_leftover_temporaries, write_dataset

PRE = load_tool("preprocess_data")
MERGE = load_tool("merge_datasets")


def _preprocess_args(inp, prefix, *extra):
    return ["--input", str(inp), "--output-prefix", str(prefix), "--tokenizer-type", "NullTokenizer",
            "--tokenizer-model", "10", "--chunk-bytes", "2000", "--no-progress", *extra]


def _age(paths, seconds):
    for p in paths:
        os.utime(p, (time.time() - seconds, time.time() - seconds))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_next_run_removes_what_a_sigkilled_run_left(tmp_path, capsys):
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"text": " ".join(["7"] * 200)}) + "\n" for _ in range(5000)))
    killed = subprocess.Popen([sys.executable, os.path.join(ROOT, "tools", "preprocess_data.py"),
                               *_preprocess_args(inp, tmp_path / "o", "--workers", "2")], stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while not any(".tmp" in f for f in os.listdir(tmp_path)) and time.time() < deadline:
        time.sleep(0.01)
    killed.send_signal(signal.SIGKILL)   # no cleanup can run
    killed.wait()
    left = sorted(f for f in os.listdir(tmp_path) if ".tmp" in f)
    assert left and all(re.search(rf"\.tmp{killed.pid}-[0-9a-f]+$", f) for f in left), left
    other = tmp_path / f"o_text_document_v2.bin.tmp{_dead_pid()}"   # another prefix: not this output's
    other.write_bytes(b"x")
    _age([tmp_path / f for f in left] + [other], 3600)

    assert PRE.main(_preprocess_args(inp, tmp_path / "o")) == 0
    err = capsys.readouterr().err
    assert f"removed {len(left)} temporary file(s) of {tmp_path / 'o_text_document'} left by a killed earlier run" in err
    assert sorted(f for f in os.listdir(tmp_path) if ".tmp" in f) == [other.name]
    assert IndexedDataset(str(tmp_path / "o_text_document")).num_documents == 5000


def test_recent_or_live_temporaries_are_left_in_place(tmp_path):
    prefix = str(tmp_path / "m")
    recent = tmp_path / f"m.bin.tmp{_dead_pid()}"          # its process is gone, but it changed just now
    live = tmp_path / f"m.bin.tmp{os.getppid()}"           # a running process (this test's parent)
    old_live = tmp_path / f"m.idx.tmp{os.getppid()}"
    for p in (recent, live, old_live):
        p.write_bytes(b"partial")
    _age([old_live], 3600)
    logged = []
    assert remove_leftover_temporaries(prefix, logged.append) == 0
    assert recent.exists() and live.exists() and old_live.exists()
    assert len(logged) == 1 and "left 1 temporary file(s)" in logged[0] and str(recent) in logged[0]
    assert remove_leftover_temporaries(str(tmp_path / "new" / "m"), logged.append) == 0   # no folder yet


def test_merge_removes_a_killed_merges_temporaries(tmp_path, capsys):
    part = str(tmp_path / "p")
    write_dataset(part, [[1, 2], [3]])
    stale = [tmp_path / f"m.{ext}.tmp{_dead_pid()}" for ext in ("bin", "lengths")]
    for p in stale:
        p.write_bytes(b"\0" * 4096)
    _age(stale, 3600)
    assert MERGE.main(["--input", part, "--output-prefix", str(tmp_path / "m")]) == 0
    assert "removed 2 temporary file(s)" in capsys.readouterr().err
    assert not any(p.exists() for p in stale) and IndexedDataset(str(tmp_path / "m")).num_documents == 2


def test_a_leftover_that_cannot_be_removed_is_reported_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"text": "1 2 3"}) + "\n")
    stuck, gone = (tmp_path / f"o_text_document.{ext}.tmp{_dead_pid()}" for ext in ("bin", "idx"))
    for p in (stuck, gone):
        p.write_bytes(b"partial")
    _age([stuck, gone], 3600)
    real_remove = os.remove

    def remove(path):
        if str(path) == str(stuck):
            raise PermissionError(13, "Permission denied", str(path))
        real_remove(path)

    monkeypatch.setattr(os, "remove", remove)
    assert PRE.main(_preprocess_args(inp, tmp_path / "o")) == 0
    err = capsys.readouterr().err
    assert "removed 1 temporary file(s)" in err and gone.name in err
    assert f"could not remove temporary file(s) of {tmp_path / 'o_text_document'}" in err and "Permission denied" in err
    assert stuck.exists() and not gone.exists()
