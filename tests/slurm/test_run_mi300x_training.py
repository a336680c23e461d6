"""End to end under the real local Slurm: `sbatch run_mi300x.sh` trains zaya1-tiny with pretrain_zaya.py.

    python -m pytest -q tests/slurm/test_run_mi300x_training.py

1. A 2-node x 2-task CPU job (gloo) trains a few iterations and leaves its logs, TensorBoard events
   and checkpoints where the launcher says.
2. The same job gets Slurm's time-limit warning, SIGUSR1 to the batch script, once training is under
   way: `scancel --batch --signal=USR1` is the delivery `--signal=B:USR1@N` makes, sent when the
   rank-0 log shows iteration 3 instead of at Slurm's next periodic limit check (up to ~30 s late,
   after a 16-iteration run may already have finished). The warning reaches the trainer through the
   launcher; it saves and exits, the job requeues itself, and the requeued job resumes from that
   checkpoint and logs the same per-iteration losses as the uninterrupted run. The time-limit
   delivery itself is tested with the stand-in trainer (test_run_mi300x_launcher.py), which cannot
   finish before the warning comes.
3. The same job loses one node's trainers (SIGKILLed after a checkpoint): the launcher blames that node
   only, resubmits without it, and the new job resumes with the uninterrupted run's losses.

A tiny corpus, SentencePiece model and indexed dataset are built in a temp folder with the
project's own data tools. Skipped (with the reason) when pretrain_zaya.py is absent or Slurm
cannot be provided.
"""
from __future__ import annotations

import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from slurm_jobs import REPO, TERMINAL, Jobs, read

pytestmark = pytest.mark.skipif(not os.path.isfile(os.path.join(REPO, "pretrain_zaya.py")),
                                reason="pretrain_zaya.py is not in the repository yet")

TRAIN_ITERS = 16
LOSS_RE = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|.*?\| lm loss: ([-+]?(?:NAN|INF)|[0-9.E+-]+)")


@pytest.fixture(scope="module")
def tiny_dataset():
    d = tempfile.mkdtemp(prefix="zs-data-", dir="/tmp")
    try:
        yield _build_dataset(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _build_dataset(d: str) -> dict:
    os.chmod(d, 0o755)
    sys.path.insert(0, REPO)
    from megatron_zaya.data.synthetic import TextGenerator

    gen = TextGenerator(seed=11, lexicon_size=2000)
    with open(os.path.join(d, "train.jsonl"), "w") as f:
        for _ in range(400):
            f.write(json.dumps({"text": gen.document(max_sentences=10)}) + "\n")
    py = sys.executable
    subprocess.run([py, os.path.join(REPO, "tools/train_tokenizer.py"), "--input", f"{d}/train.jsonl",
                    "--vocab-size", "1000", "--output-prefix", f"{d}/sp", "--num-threads", "1"],
                   check=True, capture_output=True, timeout=120)
    subprocess.run([py, os.path.join(REPO, "tools/preprocess_data.py"), "--input", f"{d}/train.jsonl",
                    "--output-prefix", f"{d}/corpus", "--tokenizer-type", "GPTSentencePieceTokenizer",
                    "--tokenizer-model", f"{d}/sp.model", "--append-eod", "--workers", "1", "--no-progress"],
                   check=True, capture_output=True, timeout=120)
    assert os.path.isfile(f"{d}/corpus_text_document.bin")
    return {"data_path": f"{d}/corpus_text_document", "tokenizer_model": f"{d}/sp.model", "dir": d}


def train_env(dataset: dict, ckpt: str) -> dict:
    return dict(
        PYTHON=sys.executable, CONFIG="", PRESET="zaya1-tiny",
        DATA_PATH=dataset["data_path"], TOKENIZER_TYPE="GPTSentencePieceTokenizer",
        TOKENIZER_MODEL=dataset["tokenizer_model"], SEQ_LENGTH="128", MICRO_BATCH_SIZE="2",
        GLOBAL_BATCH_SIZE="8", TRAIN_ITERS=str(TRAIN_ITERS), LR="3e-3", SAVE_INTERVAL="8", LOG_INTERVAL="1",
        EVAL_INTERVAL="8", EVAL_ITERS="1", CKPT_DIR=ckpt,
        EXTRA_ARGS="--num-workers 0 --lr-warmup-iters 2 --data-cache-path "
                   + os.path.join(os.path.dirname(ckpt), "cache"),
        OMP_NUM_THREADS="1", USR1_REPEAT_SECONDS="10", REQUIRE_GPU="0",     # (a CPU test cluster)
    )


def losses(text: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(3) for m in LOSS_RE.finditer(text)}


@pytest.fixture(scope="module")
def reference_run(slurm, tiny_dataset):
    """The uninterrupted 2-node x 2-task run (also the reference for the requeue test)."""

    work = tempfile.mkdtemp(prefix="zs-ref-", dir="/tmp")
    os.chmod(work, 0o755)
    try:
        jobs = Jobs(slurm, work)
        env = train_env(tiny_dataset, os.path.join(work, "ckpt"))
        job = jobs.submit(["--nodes=2", "--ntasks-per-node=2", "--time=5", "--signal=B:USR1@30",
                           "--job-name=ztrain"], env)
        info = jobs.wait(job, 240)
        yield {"jobs": jobs, "job": job, "info": info, "env": env, "work": work}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_sbatch_two_nodes_two_tasks_trains_with_gloo(reference_run):
    jobs, job, info, env = (reference_run[k] for k in ("jobs", "job", "info", "env"))
    out = jobs.output(job)
    assert info["JobState"] == "COMPLETED", out[-4000:]
    assert info["Restarts"] == "0", out[-4000:]
    assert info["NodeList"] == "lnode[1-2]" and info["NumNodes"] == "2"
    logdir = os.path.join(reference_run["work"], "logs", f"ztrain-{job}")
    launcher = read(os.path.join(logdir, "launcher.log"))
    assert "on 2 nodes [lnode1,lnode2] x 2 tasks" in launcher and "training finished" in launcher
    rank_logs = sorted(glob.glob(os.path.join(logdir, "attempt-0", "rank-*.log")))
    assert [os.path.basename(p) for p in rank_logs] == [f"rank-{r}.log" for r in range(4)]
    rank0 = read(rank_logs[0])
    got = losses(rank0)
    assert sorted(got) == list(range(1, TRAIN_ITERS + 1)), rank0[-3000:]
    assert all(math.isfinite(float(v)) for v in got.values()), got     # (.6E prints NAN, INF)
    assert float(got[TRAIN_ITERS]) < float(got[1]), got          # it learns
    assert "validation" in rank0
    assert got == losses(out)                                      # rank 0 also reaches the job output
    ckpt = env["CKPT_DIR"]
    assert read(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).strip() == str(TRAIN_ITERS)
    assert os.path.isdir(os.path.join(ckpt, f"iter_{TRAIN_ITERS:07d}"))
    assert glob.glob(os.path.join(ckpt, "tensorboard", "events.out.tfevents.*"))


def test_sigusr1_save_requeue_resume_same_losses(reference_run, jobs, tiny_dataset):
    ref = losses(read(os.path.join(reference_run["work"], "logs", f"ztrain-{reference_run['job']}",
                                   "attempt-0", "rank-0.log")))
    assert sorted(ref) == list(range(1, TRAIN_ITERS + 1))
    env = train_env(tiny_dataset, os.path.join(jobs.workdir, "ckpt"))
    env["SAVE_INTERVAL"] = "1000"      # the only checkpoints: the signal's and the final one
    job = jobs.submit(["--nodes=2", "--ntasks-per-node=2", "--time=5", "--signal=B:USR1@30",
                       "--job-name=zrequeue"], env)
    logdir = os.path.join(jobs.workdir, "logs", f"zrequeue-{job}")
    rank0_log = os.path.join(logdir, "attempt-0", "rank-0.log")

    def training(info):
        try:
            return max(losses(read(rank0_log)), default=0) >= 2
        except OSError:
            return info.get("JobState") in TERMINAL

    # Asked often: the signal must reach the trainer before its 16 iterations of ~0.25 s are done.
    jobs.wait(job, 120, until=training, poll=0.2)

    def signal_seen(info):
        try:
            return "received SIGUSR1" in read(os.path.join(logdir, "launcher.log"))
        except OSError:
            return info.get("JobState") in TERMINAL

    jobs.cluster.run("scancel", "--batch", "--signal=USR1", job)
    jobs.wait(job, 10, until=signal_seen, poll=0.2)

    def requeued(info):
        try:
            return "requeueing job" in read(os.path.join(logdir, "launcher.log"))
        except OSError:
            return info.get("JobState") in TERMINAL

    jobs.wait(job, 90, until=requeued)
    launcher = read(os.path.join(logdir, "launcher.log"))
    assert "requeueing job" in launcher, (launcher, jobs.output(job)[-3000:])
    assert "received SIGUSR1" in launcher, launcher
    info = jobs.wait(job, 200, until=lambda i: i.get("JobState") in TERMINAL and i.get("Restarts") == "1")
    assert info["JobState"] == "COMPLETED", jobs.output(job)[-4000:]

    first = read(rank0_log)
    second = read(os.path.join(logdir, "attempt-1", "rank-0.log"))
    saved = int(re.search(r"requeueing job \d+ \(requeue 1/\d+\) to resume from iteration (\d+)", launcher).group(1))
    assert 0 < saved < TRAIN_ITERS, launcher
    l1, l2 = losses(first), losses(second)
    assert max(l1) == saved, (sorted(l1), saved)
    assert sorted(l2) == list(range(saved + 1, TRAIN_ITERS + 1)), second[-3000:]
    # Before the signal both runs are the same computation: a difference here is not a resume problem
    # (non-deterministic training, or the code changed between the two jobs).
    assert l1 == {i: ref[i] for i in l1}, "runs differ before any requeue"
    # Resumed exactly: every iteration after the requeue has the uninterrupted run's loss.
    assert l2 == {i: ref[i] for i in l2}, "the resumed run's losses differ from the uninterrupted run's"
    assert read(os.path.join(jobs.workdir, "ckpt", "latest_checkpointed_iteration.txt")).strip() == str(TRAIN_ITERS)


def test_a_node_lost_mid_training_is_excluded_and_the_resumed_run_has_the_same_losses(reference_run, jobs,
                                                                                         tiny_dataset):
    """lnode2's trainers and task wrappers are SIGKILLed after the checkpoint at iteration 4 (an out-of-memory
    kill; slurmd lives on). lnode1's ranks lose their gloo peers: they exit 123 (a lost peer) or die of srun's
    SIGTERM, and neither blames lnode1. The launcher resubmits without lnode2, and the new job resumes on
    lnode[1,3] from that checkpoint with the uninterrupted run's losses."""
    ref = losses(read(os.path.join(reference_run["work"], "logs", f"ztrain-{reference_run['job']}",
                                   "attempt-0", "rank-0.log")))
    ckpt = os.path.join(jobs.workdir, "ckpt")
    env = dict(train_env(tiny_dataset, ckpt), SAVE_INTERVAL="4", RESUBMIT_ARGS="--signal=B:USR1@5")
    job = jobs.submit(["--nodes=2", "--ntasks-per-node=2", "--time=5", "--job-name=zlost"], env)
    rank0_log = os.path.join(jobs.workdir, "logs", f"zlost-{job}", "attempt-0", "rank-0.log")

    def past_first_checkpoint(info):
        try:
            return max(losses(read(rank0_log)), default=0) >= 5 and read(
                os.path.join(ckpt, "latest_checkpointed_iteration.txt")).strip() == "4"
        except OSError:
            return info.get("JobState") in TERMINAL

    info = jobs.wait(job, 120, until=past_first_checkpoint, poll=0.1)
    assert info["JobState"] == "RUNNING" and info["NodeList"] == "lnode[1-2]", (info, jobs.output(job)[-3000:])
    assert len(jobs.cluster.kill_tasks(job, "lnode2")) == 4
    assert jobs.wait(job, 60)["JobState"] == "FAILED"
    log = read(os.path.join(jobs.workdir, "logs", f"zlost-{job}", "launcher.log"))
    assert "0 rank(s) failed by themselves" in log and "failed nodes: lnode2\n" in log, log
    m = re.search(r"resubmitted as job (\d+) \(restart 1/3, excluding lnode2\), resuming from iteration (\d+)", log)
    assert m, log
    second, resumed_at = m.group(1), int(m.group(2))
    assert resumed_at >= 4 and resumed_at % 4 == 0, log
    info2 = jobs.wait(second, 200)
    assert info2["JobState"] == "COMPLETED" and info2["NodeList"] == "lnode[1,3]", jobs.output(second)[-4000:]
    resumed = losses(read(os.path.join(jobs.workdir, "logs", f"zlost-{second}", "attempt-0", "rank-0.log")))
    assert sorted(resumed) == list(range(resumed_at + 1, TRAIN_ITERS + 1)), resumed
    assert resumed == {i: ref[i] for i in resumed}, "the resumed run's losses differ from the uninterrupted run's"
