"""run_mi300x.sh: --dry-run, and real sbatch jobs on the local Slurm with a stand-in trainer.

    python -m pytest -q tests/slurm/test_run_mi300x_launcher.py

The stand-in (standin_trainer.py) needs no torch, so these tests check the launcher itself:
rank layout and environment, per-job logs, failure -> resubmission without the failed node,
the restart bound, and SIGUSR1 -> checkpoint -> scontrol requeue -> resume.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

from slurm_jobs import LAUNCHER, REPO, latest, read, standin_env, standin_views


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))
           and k not in ("TRITON_CACHE_DIR", "MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR")}
    env.update(extra)
    return env


# ---------------------------------------------------------------------------------------------
# --dry-run (no Slurm needed)
# ---------------------------------------------------------------------------------------------

def test_dry_run_outside_slurm_prints_the_full_command():
    r = subprocess.run(["bash", LAUNCHER, "--dry-run"], env=clean_env(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    srun = [line for line in lines if line.startswith("srun ")]
    assert len(srun) == 1, r.stdout
    cmd = srun[0]
    for part in ("--nodes=128", "--ntasks-per-node=8", "--ntasks=1024", "--kill-on-bad-exit=1",
                 os.path.join(REPO, "pretrain_zaya.py"), "--config " + os.path.join(REPO, "examples/zaya1_base/phase1_4k.yaml"),
                 "--save ", "--load "):
        assert part in cmd, (part, cmd)
    exports = dict(line[len("export "):].split("=", 1) for line in lines if line.startswith("export "))
    assert exports["NCCL_IB_GID_INDEX"] == "3"
    assert exports["HSA_NO_SCRATCH_RECLAIM"] == "1"
    assert exports["GPU_MAX_HW_QUEUES"] == "2"
    assert "scontrol show hostnames" in exports["MASTER_ADDR"]
    # Kernel caches on the node's own disk, not in a shared home.
    cache = os.path.join(os.environ.get("TMPDIR", "/tmp"), "megatron-zaya-")
    assert exports["TRITON_CACHE_DIR"].startswith(cache) and exports["TRITON_CACHE_DIR"].endswith("/triton")
    assert exports["MIOPEN_USER_DB_PATH"] == exports["MIOPEN_CUSTOM_CACHE_DIR"] == \
        exports["TRITON_CACHE_DIR"][:-len("triton")] + "miopen"


def test_dry_run_every_value_overridable():
    env = clean_env(NNODES="4", NTASKS_PER_NODE="8", NCCL_IB_HCA="rdma0,rdma1", NCCL_SOCKET_IFNAME="ens51f0",
                    NCCL_IB_GID_INDEX="1", HSA_NO_SCRATCH_RECLAIM="0", GPU_MAX_HW_QUEUES="4", MASTER_ADDR="10.0.0.1",
                    MASTER_PORT="12345", PYTHON="/opt/venv/bin/python", CONFIG="", PRESET="zaya1-tiny",
                    TRITON_CACHE_DIR="/scratch/triton", MIOPEN_USER_DB_PATH="/scratch/miopen",
                    DATA_PATH="30 /d/a_text_document 70 /d/b_text_document", TRAIN_ITERS="100", TP="2", CP="2", EP="4",
                    CKPT_DIR="/ckpt/run1", EXTRA_ARGS="--bf16 --seed 7", SRUN_ARGS="--cpu-bind=none")
    r = subprocess.run(["bash", LAUNCHER, "--dry-run", "--lr", "1e-4"], env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for line in ("export NCCL_IB_HCA=rdma0\\,rdma1", "export NCCL_SOCKET_IFNAME=ens51f0", "export NCCL_IB_GID_INDEX=1",
                 "export HSA_NO_SCRATCH_RECLAIM=0", "export GPU_MAX_HW_QUEUES=4", "export MASTER_ADDR=10.0.0.1",
                 "export MASTER_PORT=12345", "export TRITON_CACHE_DIR=/scratch/triton",
                 "export MIOPEN_USER_DB_PATH=/scratch/miopen"):
        assert line in out.splitlines(), (line, out)
    cmd = next(line for line in out.splitlines() if line.startswith("srun "))
    assert "--nodes=4 --ntasks-per-node=8 --ntasks=32" in cmd
    assert "--cpu-bind=none" in cmd
    assert "-- /opt/venv/bin/python " + os.path.join(REPO, "pretrain_zaya.py") + " --preset zaya1-tiny --data-path 30 " \
           "/d/a_text_document 70 /d/b_text_document --train-iters 100 --tensor-model-parallel-size 2 " \
           "--context-parallel-size 2 --expert-model-parallel-size 4" in cmd, cmd
    assert cmd.rstrip().endswith("--save /ckpt/run1 --load /ckpt/run1 --bf16 --seed 7 --lr 1e-4"), cmd
    assert "--config" not in cmd

    r = subprocess.run(["bash", LAUNCHER, "--dry-run"], env=clean_env(TRAIN_SCRIPT="/x/train.py", TRAIN_ARGS="--a 1 --b",
                                                                       CKPT_DIR=""),
                       capture_output=True, text=True, timeout=30)
    cmd = next(line for line in r.stdout.splitlines() if line.startswith("srun "))
    assert cmd.rstrip().endswith("-- python3 /x/train.py --a 1 --b"), cmd


def test_dry_run_init_ckpt_dir_until_the_run_has_its_own(tmp_path):
    env = clean_env(CKPT_DIR=str(tmp_path / "phase2"), INIT_CKPT_DIR="/ckpt/phase1")
    r = subprocess.run(["bash", LAUNCHER, "--dry-run"], env=env, capture_output=True, text=True, timeout=30)
    # the previous phase must hold a checkpoint: with a typo in INIT_CKPT_DIR the trainer refuses to start
    assert f"--save {tmp_path}/phase2 --load /ckpt/phase1 --exit-on-missing-checkpoint" in r.stdout
    (tmp_path / "phase2" / "iter_0000100.partial-1").mkdir(parents=True)      # a save that never completed
    (tmp_path / "phase2" / "iter_0000100").mkdir()
    r = subprocess.run(["bash", LAUNCHER, "--dry-run"], env=env, capture_output=True, text=True, timeout=30)
    assert f"--save {tmp_path}/phase2 --load /ckpt/phase1" in r.stdout
    # a first save stopped between publishing iter_N (COMPLETE marker in it) and writing the latest file:
    # the run has its own checkpoint (the trainer completes the file); INIT_CKPT_DIR again was refused by
    # the trainer (--save holds checkpoints this run does not continue from) at every restart
    (tmp_path / "phase2" / "iter_0000100" / "COMPLETE").write_text("")
    r = subprocess.run(["bash", LAUNCHER, "--dry-run"], env=env, capture_output=True, text=True, timeout=30)
    assert f"--save {tmp_path}/phase2 --load {tmp_path}/phase2" in r.stdout
    (tmp_path / "phase2" / "latest_checkpointed_iteration.txt").write_text("100\n")
    r = subprocess.run(["bash", LAUNCHER, "--dry-run"], env=env, capture_output=True, text=True, timeout=30)
    assert f"--save {tmp_path}/phase2 --load {tmp_path}/phase2" in r.stdout
    assert "--exit-on-missing-checkpoint" not in r.stdout          # a run resumes (or starts) as it always did


def test_outside_slurm_without_dry_run_says_how_to_submit():
    r = subprocess.run(["bash", LAUNCHER], env=clean_env(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "not inside a Slurm job" in r.stderr and "sbatch run_mi300x.sh" in r.stderr
    # A job id left in a login shell (no node list): said in one line, not "unbound variable".
    r = subprocess.run(["bash", LAUNCHER], env=clean_env(SLURM_JOB_ID="123"), capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and "unbound" not in r.stderr, r.stderr
    assert "SLURM_JOB_ID=123 is set but SLURM_JOB_NODELIST is not" in r.stderr


def test_a_copy_of_the_launcher_outside_the_repository_needs_repo_dir(tmp_path):
    """The launcher sources scripts/run_mi300x_recovery.sh: a copy elsewhere says so at once, or uses REPO_DIR."""
    copy = tmp_path / "my_run.sh"
    copy.write_text(read(LAUNCHER))
    r = subprocess.run(["bash", str(copy), "--dry-run"], env=clean_env(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "cannot find scripts/run_mi300x_recovery.sh" in r.stderr, r.stderr
    assert f"next to {copy}" in r.stderr and "set REPO_DIR" in r.stderr
    r = subprocess.run(["bash", str(copy), "--dry-run"], env=clean_env(REPO_DIR=REPO), capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0 and f"{REPO}/pretrain_zaya.py" in r.stdout, r.stderr
    # a copy with an older scripts/ beside it (the recovery, not checkpoint_latest.sh) and no REPO_DIR: it
    # went on without its latest-checkpoint function (INIT_CKPT_DIR was never used)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "run_mi300x_recovery.sh").write_text(read(os.path.join(REPO, "scripts",
                                                                                      "run_mi300x_recovery.sh")))
    r = subprocess.run(["bash", str(copy), "--dry-run"], env=clean_env(REPO_DIR=str(tmp_path)), capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and "cannot find scripts/checkpoint_latest.sh next to" in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------------
# Real sbatch jobs with the stand-in trainer
# ---------------------------------------------------------------------------------------------

def test_two_nodes_two_tasks_layout_and_logs(jobs):
    marker = os.path.join(jobs.workdir, "next-phase")
    env = standin_env(jobs.workdir, TRAIN_ARGS="--train-iters 6 --save-interval 3", END_ITER="6",
                      ON_SUCCESS_CMD=f"echo restart=$ZAYA_RESTART job=${{SLURM_JOB_ID:-none}} > {marker}")
    job = jobs.submit(["--nodes=2", "--ntasks-per-node=2", "--time=2", "--job-name=zlayout"], env)
    info = jobs.wait(job, 60)
    assert info["JobState"] == "COMPLETED", jobs.output(job)
    assert info["ExitCode"] == "0:0"

    logdir = os.path.join(jobs.workdir, "logs", f"zlayout-{job}")
    launcher_log = read(os.path.join(logdir, "launcher.log"))
    assert "on 2 nodes [lnode1,lnode2] x 2 tasks" in launcher_log
    assert "training finished" in launcher_log
    assert read(os.path.join(logdir, "command.sh")).count("srun ") == 1
    views = []
    for r in range(4):
        views += standin_views(read(os.path.join(logdir, "attempt-0", f"rank-{r}.log")))
    assert sorted(int(v["RANK"]) for v in views) == [0, 1, 2, 3]
    for v in views:
        assert v["WORLD_SIZE"] == "4" and v["LOCAL_WORLD_SIZE"] == "2"
        assert v["RANK"] == v["SLURM_PROCID"]
        assert int(v["LOCAL_RANK"]) == int(v["RANK"]) % 2
        assert v["SLURMD_NODENAME"] == ("lnode1" if int(v["RANK"]) < 2 else "lnode2")
        assert v["MASTER_ADDR"] == "lnode1" and int(v["MASTER_PORT"]) > 1024
        assert v["HSA_NO_SCRATCH_RECLAIM"] == "1" and v["OMP_NUM_THREADS"] == "1"
        assert v["TRITON_CACHE_DIR"].endswith("/triton") and os.path.isdir(v["MIOPEN_USER_DB_PATH"])   # node-local
        assert v["resumed_from"] == 0 and v["unknown_args"] == []
    # Rank 0's output also reaches the job's Slurm output file.
    assert "standin: iteration 6" in jobs.output(job)
    assert latest(env["CKPT_DIR"]) == 6
    assert os.path.isdir(os.path.join(env["CKPT_DIR"], "iter_0000003"))
    # ON_SUCCESS_CMD ran once training finished, outside this job's Slurm environment.
    assert read(marker).strip() == "restart=0 job=none"


def test_failure_resubmits_without_the_failed_node_and_resumes(jobs):
    # The healthy ranks die of srun's SIGTERM (143), often before their task wrapper's trap records the
    # signal: not to blame (tests/slurm/test_run_mi300x_decisions.py has the cases without a real Slurm).
    env = standin_env(jobs.workdir, TRAIN_ARGS="--train-iters 8 --save-interval 2", STANDIN_FAIL_NODE="lnode2",
                      STANDIN_FAIL_AT="5", MAX_RESTARTS="2", STANDIN_DEFAULT_SIGTERM="1")
    first = jobs.submit(["--nodes=2", "--ntasks-per-node=2", "--time=2", "--job-name=zfail"], env)
    info = jobs.wait(first, 60)
    assert info["JobState"] == "FAILED", jobs.output(first)
    log1 = read(os.path.join(jobs.workdir, "logs", f"zfail-{first}", "launcher.log"))
    assert "failed nodes: lnode2" in log1, log1
    m = re.search(r"resubmitted as job (\d+) \(restart 1/2, excluding lnode2\)", log1)
    assert m, log1
    second = m.group(1)
    info2 = jobs.wait(second, 60)
    assert info2["JobState"] == "COMPLETED", jobs.output(second)
    assert info2["ExcNodeList"] == "lnode2"
    assert info2["NodeList"] == "lnode[1,3]"
    views = standin_views(read(os.path.join(jobs.workdir, "logs", f"zfail-{second}", "attempt-0", "rank-0.log")))
    assert views[0]["ZAYA_RESTART"] == "1"
    # Resumed from the checkpoint that was the latest when the first job failed (>= 4: saved every
    # 2 iterations before the failure at 5; the healthy ranks may have run a little further).
    at_failure = int(re.search(r"ended with exit code \d+ after \d+ s; latest checkpoint: (\d+)", log1).group(1))
    assert at_failure >= 4
    assert views[0]["resumed_from"] == at_failure
    assert views[0]["MASTER_ADDR"] == "lnode1"
    assert latest(env["CKPT_DIR"]) == 8


def test_crash_at_shutdown_after_the_last_checkpoint_is_success(jobs):
    env = standin_env(jobs.workdir, TRAIN_ARGS="--train-iters 4", END_ITER="4", STANDIN_ABORT_AT_EXIT_NODE="lnode2")
    job = jobs.submit(["--nodes=2", "--ntasks-per-node=2", "--time=2", "--job-name=zabort"], env)
    info = jobs.wait(job, 60)
    log = read(os.path.join(jobs.workdir, "logs", f"zabort-{job}", "launcher.log"))
    assert info["JobState"] == "COMPLETED", log
    assert "= END_ITER: the run is complete" in log and "training finished" in log
    assert "resubmitted" not in log


def test_restarts_are_bounded(jobs):
    env = standin_env(jobs.workdir, TRAIN_ARGS="--train-iters 8", STANDIN_FAIL_NODE="lnode1", STANDIN_FAIL_AT="1",
                      MAX_RESTARTS="0")
    job = jobs.submit(["--nodes=2", "--ntasks-per-node=2", "--time=2", "--job-name=zbound"], env)
    info = jobs.wait(job, 60)
    assert info["JobState"] == "FAILED"
    log = read(os.path.join(jobs.workdir, "logs", f"zbound-{job}", "launcher.log"))
    assert "failed nodes: lnode1" in log
    assert "giving up: MAX_RESTARTS=0" in log
    assert "resubmitted" not in log


def test_reproducible_failure_is_not_restarted_again_and_again(jobs):
    # Every rank fails at iteration 1 on every submission. Either every node reports its own failure
    # (a software error: given up at once, no node blamed), or srun stops some ranks first and the
    # others' node is excluded once; then the resubmitted job fails at the same checkpoint and the
    # launcher gives up. Never more than one restart, although MAX_RESTARTS allows 3.
    env = standin_env(jobs.workdir, TRAIN_ARGS="--train-iters 8", STANDIN_FAIL_NODE="*", STANDIN_FAIL_AT="1",
                      STANDIN_FAIL_ALWAYS="1", MAX_RESTARTS="3")
    job = jobs.submit(["--nodes=2", "--ntasks-per-node=2", "--time=2", "--job-name=zrepro"], env)
    info = jobs.wait(job, 60)
    assert info["JobState"] == "FAILED"
    log = read(os.path.join(jobs.workdir, "logs", f"zrepro-{job}", "launcher.log"))
    m = re.search(r"resubmitted as job (\d+)", log)
    if m is None:
        assert "giving up: every node failed before a new checkpoint was written" in log, log
        return
    second = m.group(1)
    info = jobs.wait(second, 60)
    assert info["JobState"] == "FAILED"
    log2 = read(os.path.join(jobs.workdir, "logs", f"zrepro-{second}", "launcher.log"))
    assert "giving up: " in log2 and "resubmitted" not in log2, log2


def test_sigusr1_before_time_limit_saves_requeues_and_resumes(jobs):
    # --time=2 with B:USR1@90: the batch script gets SIGUSR1 30-60 s into the job (Slurm checks
    # limits periodically), after the first iterations even when a loaded machine starts the 4
    # ranks slowly (with 10 s of lead, a CI run once had the signal before iteration 1). 150
    # iterations of 1 s cannot finish before it arrives. Resumed, the rest go at 0.01 s each (1-2 s in all): the
    # attempt only has to reach the end and save.
    iters = 150
    env = standin_env(jobs.workdir, TRAIN_ARGS=f"--train-iters {iters} --save-interval 1000", STANDIN_ITER_SECONDS="1",
                      STANDIN_RESUME_ITER_SECONDS="0.01")
    job = jobs.submit(["--nodes=2", "--ntasks-per-node=2", "--time=2", "--signal=B:USR1@90", "--job-name=zusr1"], env)
    logdir = os.path.join(jobs.workdir, "logs", f"zusr1-{job}")

    def requeued(info):
        try:
            return "requeueing job" in read(os.path.join(logdir, "launcher.log"))
        except OSError:
            return False

    jobs.wait(job, 120, until=requeued)
    # One requeue is enough for the test: give the resumed attempt room to finish.
    jobs.cluster.run("scontrol", "update", f"JobId={job}", "TimeLimit=4")
    info = jobs.wait(job, 90, until=lambda i: i.get("JobState") in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED")
                     and i.get("Restarts") == "1")
    assert info["JobState"] == "COMPLETED", jobs.output(job)
    log = read(os.path.join(logdir, "launcher.log"))
    assert "received SIGUSR1" in log
    first = read(os.path.join(logdir, "attempt-0", "rank-0.log"))
    m = re.search(r"rank 0 got SIGUSR1 at iteration (\d+): saving and exiting", first)
    assert m, first
    saved = int(m.group(1))
    assert 0 < saved < iters
    assert f"requeueing job {job} (requeue 1/50) to resume from iteration {saved}" in log
    resumed = standin_views(read(os.path.join(logdir, "attempt-1", "rank-0.log")))
    assert resumed[0]["SLURM_RESTART_COUNT"] == "1"
    assert resumed[0]["resumed_from"] == saved
    assert latest(os.path.join(jobs.workdir, "ckpt")) == iters
    # --open-mode=append: both attempts are in the one Slurm output file.
    out = jobs.output(job)
    assert "attempt 0" in out and "attempt 1" in out   # (and no TIMEOUT: the state is COMPLETED)


def test_check_runs_the_trainers_dry_run_for_the_jobs_world_size(tmp_path):
    """--check: the --dry-run text, then pretrain_zaya.py --dry-run in this shell with WORLD_SIZE = nodes x
    tasks; a flag the trainer refuses fails here, before any sbatch."""
    base = "--preset zaya1-tiny --num-layers 2 --mock-data --tokenizer-type NullTokenizer --vocab-size 512 " \
           "--seq-length 32 --micro-batch-size 1 --global-batch-size 8 --train-iters 2 --eval-iters 0"
    env = clean_env(NNODES="2", NTASKS_PER_NODE="4", TRAIN_ARGS=base, PYTHON=sys.executable)
    r = subprocess.run(["bash", LAUNCHER, "--check"], env=env, capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert "srun " in r.stdout and "layout: 8 processes: DP 8 x TP 1 x CP 1, EP 1" in r.stdout
    assert "dry run: every check passed for 8 processes and 2 iterations" in r.stdout
    env["TRAIN_ARGS"] = base.replace("--global-batch-size 8", "--global-batch-size 12")
    r = subprocess.run(["bash", LAUNCHER, "--check"], env=env, capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 2 and "--global-batch-size" in r.stderr, r.stderr[-2000:]
