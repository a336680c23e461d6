"""pretrain_zaya.py under torchrun (2 gloo processes) computes the single-process losses step by step.

Same global batch, fp32: DP=2 plain, DP=2 with the ZeRO-1 optimizer (AdamW shards + distributed Muon),
and CP=2 (each rank holds half of every sequence). Tolerance: 1e-5 relative on every step's loss."""
import os
import socket
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.training.helpers import tiny_run_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def losses(logdir) -> list[float]:
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars("lm loss")]


def train(corpus, tmp_path, name, nproc, *extra) -> list[float]:
    tb = tmp_path / name
    argv = tiny_run_flags(corpus, tmp_path, **{"--tensorboard-dir": tb, "--train-iters": 4, "--eval-iters": 0,
                                                "--micro-batch-size": 1, "--global-batch-size": 4}) + list(extra)
    env = dict(os.environ, OMP_NUM_THREADS="1", MEGATRON_ZAYA_KERNELS="torch")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    if nproc == 1:
        cmd = [sys.executable, "pretrain_zaya.py", *argv]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
               "127.0.0.1", "--master-port", str(free_port()), "pretrain_zaya.py", *argv]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return losses(tb)


@pytest.fixture(scope="module")
def reference_losses(tiny_corpus, tmp_path_factory):
    return train(tiny_corpus, tmp_path_factory.mktemp("single"), "single", 1)


@pytest.mark.parametrize("name, extra", [
    ("dp2", []),
    ("dp2-zero1", ["--use-distributed-optimizer"]),
    ("cp2", ["--context-parallel-size", "2"]),
])
def test_two_processes_match_one(tiny_corpus, tmp_path, reference_losses, name, extra):
    got = train(tiny_corpus, tmp_path, name, 2, *extra)
    assert len(got) == len(reference_losses) == 4
    assert got == pytest.approx(reference_losses, rel=1e-5), (got, reference_losses)
