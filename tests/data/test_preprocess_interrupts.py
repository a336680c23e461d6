"""tools/preprocess_data.py stopped part-way: an interrupt, SIGTERM or Ctrl-C (the first stops at the next
chunk, megatron_zaya/interrupts.StopOnSignal), a failing worker. Every case leaves no output and gives its
exit status (130 interrupted, 3 a worker failed)."""

import json
import os

import pytest

from data_test_utils import load_tool, run_preprocess
from megatron_zaya.data import preprocess as pre

PRE = load_tool("preprocess_data")


def run_tool(*args):
    return run_preprocess(PRE, *args)


def test_interrupted_run_leaves_no_output(tmp_path, monkeypatch):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"text": f"{i} {i}"}) + "\n" for i in range(200)))
    calls = {"n": 0}
    real = pre.Encoder.encode_chunk

    def flaky(self, records):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self, records)

    monkeypatch.setattr(pre.Encoder, "encode_chunk", flaky)
    assert run_tool("--input", path, "--output-prefix", tmp_path / "o", "--tokenizer-type", "NullTokenizer",
                    "--tokenizer-model", 1000, "--chunk-bytes", 200) == 130
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_stops_at_the_next_chunk_and_restores_the_handler(tmp_path, monkeypatch, capsys, signame):
    import signal

    signum = getattr(signal, signame)
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"text": f"{i} {i}"}) + "\n" for i in range(200)))
    calls = {"n": 0}
    real = pre.Encoder.encode_chunk

    def signalled(self, records):   # the signal lands inside a chunk: that chunk finishes, no later one starts
        calls["n"] += 1
        if calls["n"] == 2:
            os.kill(os.getpid(), signum)
        return real(self, records)

    before = signal.getsignal(signum)
    monkeypatch.setattr(pre.Encoder, "encode_chunk", signalled)
    assert run_tool("--input", path, "--output-prefix", tmp_path / "o", "--tokenizer-type", "NullTokenizer",
                    "--tokenizer-model", 1000, "--chunk-bytes", 200) == 130
    assert calls["n"] == 2 and f"interrupted ({signame}): no output written" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]
    assert signal.getsignal(signum) is before


@pytest.mark.parametrize("first, second", [("SIGTERM", "SIGINT"), ("SIGINT", "SIGTERM"), ("SIGTERM", "SIGTERM")])
def test_stop_on_signal_a_second_signal_raises_at_once(first, second):
    """interrupts.StopOnSignal (its docstring and the module's): the first SIGTERM or Ctrl-C only sets the flag the
    tool checks between chunks; a second one, either signal, raises KeyboardInterrupt at once (a user whose stop
    seems ignored, or a scheduler's repeated SIGTERM, must not wait for the chunk). Real signals to this process."""
    import signal

    from megatron_zaya.interrupts import StopOnSignal

    stop = StopOnSignal()
    try:
        signal.raise_signal(getattr(signal, first))
        assert stop.pending() and stop.received == first
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(getattr(signal, second))
    finally:
        stop.restore()


def test_sigterm_to_the_whole_process_group_is_an_interruption_not_a_worker_failure(tmp_path, monkeypatch, capsys):
    import signal

    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"text": f"{i} {i}"}) + "\n" for i in range(200)))

    def scancel(self, records):   # as Slurm's scancel: SIGTERM once to every process; the workers end
        if b'"0 0"' in records[0].raw:   # the first chunk's worker signals the parent (once, as scancel would)
            os.kill(os.getppid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(pre.Encoder, "encode_chunk", scancel)
    assert run_tool("--input", path, "--output-prefix", tmp_path / "o", "--tokenizer-type", "NullTokenizer",
                    "--tokenizer-model", 1000, "--chunk-bytes", 200, "--workers", 2) == 130
    assert "interrupted (SIGTERM): no output written" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_a_stop_request_after_the_last_chunk_still_replaces_nothing(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"text": f"{i} {i}"}) + "\n" for i in range(20)))
    cfg = pre.PreprocessConfig(input=[str(path)], output_prefix=str(tmp_path / "o"), tokenizer_type="NullTokenizer",
                               tokenizer_model="100", progress=False)
    asked = []
    with pytest.raises(KeyboardInterrupt):   # one chunk: asked after it, then once more before the swap
        pre.run(cfg, should_stop=lambda: asked.append(1) is None and len(asked) == 2)
    assert len(asked) == 2 and sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_a_failing_worker_is_exit_3_and_leaves_no_output(tmp_path, monkeypatch, capsys):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"text": f"{i} {i}"}) + "\n" for i in range(200)))

    def broken(self, records):   # forked workers inherit the patch; not a StrictError: a bug
        raise RuntimeError("tokenizer exploded")

    monkeypatch.setattr(pre.Encoder, "encode_chunk", broken)
    assert run_tool("--input", path, "--output-prefix", tmp_path / "o", "--tokenizer-type", "NullTokenizer",
                    "--tokenizer-model", 1000, "--chunk-bytes", 200, "--workers", 2) == 3
    err = capsys.readouterr().err
    assert "worker process" in err and "RuntimeError: tokenizer exploded" in err and "no output written" in err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_sigterm_mid_run_leaves_no_output(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"text": " ".join(["7"] * 200)}) + "\n" for _ in range(5000)))
    tool = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "tools", "preprocess_data.py")
    proc = subprocess.Popen([sys.executable, tool, "--input", str(path), "--output-prefix", str(tmp_path / "o"),
                             "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "10", "--workers", "2",
                             "--chunk-bytes", "2000", "--no-progress"], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while not any(".tmp" in f for f in os.listdir(tmp_path)) and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    if proc.returncode == 0:
        pytest.skip("the run finished before the signal arrived")
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_a_report_tool_piped_into_head_ends_quietly():
    """`tools/inspect_checkpoint.py ... | head`: the reader leaving ended the tools with a BrokenPipeError
    traceback (exit 1); now as any command does, status 141 (SIGPIPE) and nothing on stderr."""
    import subprocess
    import sys

    script = ("import sys\nfrom megatron_zaya.interrupts import quiet_when_the_reader_leaves\n"
              "def main():\n    for i in range(200000):\n        print('line', i)\n    return 0\n"
              "sys.exit(quiet_when_the_reader_leaves(main))\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.read(10) == b"line 0\nlin"
    proc.stdout.close()                                    # what head does after its lines
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141 and err == b"", err.decode()[-2000:]
