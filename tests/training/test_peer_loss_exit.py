"""A rank whose collective failed because another rank is gone exits 123, not 1 (parallel/peer_loss.py), so that
run_mi300x.sh blames the node that died, not this one.

    python -m pytest -q tests/training/test_peer_loss_exit.py

Two gloo processes of pretrain_zaya.py, started as torchrun would start them but without torchrun (which would
stop rank 0 itself once rank 1 died); rank 1 SIGKILLs itself at its 3rd forward (faulty_rank_pretrain.py).
"""
import os
import subprocess
import sys

from megatron_zaya.parallel.peer_loss import PEER_LOST_EXIT_CODE
from tests.parallel.parallel_launcher import free_port
from tests.training.helpers import tiny_run_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
