"""A node that dies in the middle of training, on the real local Slurm (3 emulated nodes, stand-in trainer).

    python -m pytest -q tests/slurm/test_run_mi300x_node_loss.py

The node's slurmd, slurmstepd and the job's processes there are killed, and the node is marked DOWN as
slurmctld does after SlurmdTimeout: Slurm ends the job and, as run_mi300x.sh asks for --requeue, requeues it
itself. The launcher must neither resubmit nor requeue on top of that (two copies of one run would write one
checkpoint folder), and Slurm's requeued job resumes on healthy nodes. A node whose training processes die
while its slurmd lives on is the launcher's to handle: test_run_mi300x_training.py kills one under
pretrain_zaya.py, and test_run_mi300x_task_records.py has the exit-record rules case by case.
"""
from __future__ import annotations

import os
import re

from slurm_jobs import TERMINAL, latest, read, standin_env, standin_views

TRAIN_ITERS = 80


def submit_and_wait_for_training(jobs, name: str, **extra):
    """A 2-node x 2-task stand-in job on lnode[1-2], returned once it has written its first checkpoint."""
    env = standin_env(jobs.workdir, TRAIN_ARGS=f"--train-iters {TRAIN_ITERS} --save-interval 5",
                      STANDIN_ITER_SECONDS="0.1", STANDIN_RESUME_ITER_SECONDS="0.02", **extra)
    job = jobs.submit(["--nodes=2", "--ntasks-per-node=2", "--time=3", f"--job-name={name}"], env)
    ckpt = env["CKPT_DIR"]

    def saved(info):
        return os.path.exists(os.path.join(ckpt, "latest_checkpointed_iteration.txt")) \
            or info.get("JobState") in TERMINAL

    info = jobs.wait(job, 60, until=saved, poll=0.2)
    assert info["JobState"] == "RUNNING" and info["NodeList"] == "lnode[1-2]", (info, jobs.output(job)[-3000:])
    return job, env


def test_a_dead_node_is_left_to_slurms_own_requeue(jobs):
    job, env = submit_and_wait_for_training(jobs, "zdeadnode")
    try:
        jobs.cluster.fail_node(job, "lnode2")
        # Slurm requeues the job (Restarts=1) and starts it again on the two nodes still up.
        info = jobs.wait(job, 120, until=lambda i: i.get("Restarts") == "1" and i.get("JobState") in TERMINAL)
    finally:
        jobs.cluster.revive_node("lnode2")
    logdir = os.path.join(jobs.workdir, "logs", f"zdeadnode-{job}")
    log = read(os.path.join(logdir, "launcher.log"))
    assert info["JobState"] == "COMPLETED" and info["NodeList"] == "lnode[1,3]", (info, log)
    lines = log.splitlines()
    k = next(i for i, line in enumerate(lines) if " attempt 1 (requeues 1/" in line)
    first_attempt, second_attempt = "\n".join(lines[:k]), "\n".join(lines[k:])
    # The first attempt's launcher takes the SIGTERM for what it is and stops: it neither finishes the run (which
    # would start ON_SUCCESS_CMD), nor requeues, nor resubmits it. (Slurm signals the step first: the SIGTERM can
    # reach the launcher while srun runs, "received SIGTERM: forwarding it", or only after srun has ended.)
    assert lines[k - 1].endswith("stopped by SIGTERM (cancelled, preempted or a node failed; Slurm itself requeues "
                                 "a job whose node failed); not restarting"), log
    assert "resubmitted" not in log and "requeueing" not in log, log
    assert jobs.named("zdeadnode") == [job], "a second copy of the run was submitted"
    saved = int(re.search(r"ended with exit code \d+ after \d+ s; latest checkpoint: (\d+)", first_attempt).group(1))
    views = standin_views(read(os.path.join(logdir, "attempt-1", "rank-0.log")))
    assert views[0]["SLURM_RESTART_COUNT"] == "1" and views[0]["resumed_from"] == saved >= 5, (views[0], log)
    assert "training finished" in second_attempt
    assert latest(env["CKPT_DIR"]) == TRAIN_ITERS
