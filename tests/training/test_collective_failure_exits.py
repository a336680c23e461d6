"""A rank whose collective failed because of another rank exits 123 (a peer is gone) or 124 (a collective timed
out: a rank is hung), not 1 (parallel/collective_failures.py), so that run_mi300x.sh does not blame its node.

    python -m pytest -q tests/training/test_collective_failure_exits.py

pretrain_zaya.main on each kind of error, and two real gloo processes of pretrain_zaya.py, started as torchrun
would start them but without torchrun (which would stop rank 0 itself once rank 1 died); rank 1 SIGKILLs
itself at its 3rd forward (faulty_rank_pretrain.py).
"""
import os
import subprocess
import sys

import pytest

from megatron_zaya.parallel.collective_failures import PEER_LOST_EXIT_CODE
from megatron_zaya.training.watchdog import WATCHDOG_EXIT_CODE
from tests.parallel.parallel_launcher import free_port
from tests.training.helpers import tiny_run_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# torch 2.13's gloo, as a 2-process run with a 2 s timeout and a rank that slept 6 s printed them
GLOO_TIMEOUT = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
                "2000ms for recv operation to complete")
GLOO_CLOSED = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
               "[127.0.0.1]:34992. This is typically caused by a remote worker crashing.")


@pytest.mark.parametrize("message, code, says", [
    (GLOO_TIMEOUT, WATCHDOG_EXIT_CODE, "a collective timed out: a rank is hung"),
    ("Application timeout caused pair closure", WATCHDOG_EXIT_CODE, "a collective timed out: a rank is hung"),
    (GLOO_CLOSED, PEER_LOST_EXIT_CODE, "another process of the job is gone"),
])
def test_main_exits_with_the_code_of_the_collectives_failure(tiny_corpus, tmp_path, capsys, monkeypatch, message,
                                                             code, says):
    import pretrain_zaya

    def fail(run):
        raise RuntimeError(message)

    monkeypatch.setattr(pretrain_zaya, "build_and_train", fail)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert pretrain_zaya.main(tiny_run_flags(tiny_corpus, tmp_path)) == code
    err = capsys.readouterr().err
    assert "Traceback" in err and f"pretrain_zaya.py: rank 1 of 2: {says} ({message[:60]}" in err, err
    assert f"exiting with {code}, which run_mi300x.sh does not blame on this node" in err, err


def test_a_rank_whose_peer_is_killed_exits_123_with_one_line(tiny_corpus, tmp_path):
    argv = tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": 20, "--eval-iters": 0, "--micro-batch-size": 1,
                                                      "--global-batch-size": 2, "--num-layers": 1})
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, OMP_NUM_THREADS="1", MEGATRON_ZAYA_KERNELS="torch", FAULT_RANK="1",
                   DIE_AT_FORWARD="3", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, "tests/training/faulty_rank_pretrain.py", *argv], cwd=ROOT,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert procs[1].returncode == -9, outs[1][1][-2000:]
    err = outs[0][1]
    assert procs[0].returncode == PEER_LOST_EXIT_CODE, err[-3000:]
    assert "Traceback" in err, err[-3000:]
    (line,) = [x for x in err.splitlines() if x.startswith("pretrain_zaya.py: rank 0 of 2:")]
    assert "another process of the job is gone" in line and "exiting with 123" in line, line
