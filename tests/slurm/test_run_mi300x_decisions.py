"""run_mi300x.sh's decisions after a training step, with stand-in Slurm commands (fake_slurm.py; no
Slurm, about a second per case): whom to blame, what a resubmission and a chained phase carry over,
when to requeue, the health check, single-node jobs, a master port in use.

    python -m pytest -q tests/slurm/test_run_mi300x_decisions.py
"""
from __future__ import annotations

import glob
import os
import re
import socket

import pytest

from fake_slurm import write_latest
from slurm_jobs import REPO

RECIPE = os.path.join(REPO, "examples", "zaya1_base", "run_zaya1_base.sh")


def arg(argv: list[str], flag: str) -> str | None:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(flag + "=")]
    return values[-1] if values else None


def test_ranks_that_died_of_a_signal_are_not_blamed(fake, tmp_path):
    # Rank 3 (node n2) fails by itself (exit 1); srun then stops the others: ranks that die of the signal
    # before their task wrapper's trap has run record "143 none" (here rank 1 kills itself with SIGTERM,
    # rank 0 exits 143), and a peer's RCCL watchdog may abort (134) or be killed (137).
    write_latest(str(tmp_path / "ckpt"), 5)
    r = fake.run_launcher(FAKE_RC="143 TERM 137 1")
    log = fake.launcher_log()
    assert "failed nodes: n2" in log, log
    assert "giving up" not in log, log
    (sub,) = fake.calls("sbatch")
    assert arg(sub["argv"], "--exclude") == "n2"
    assert r.returncode != 0

    r = fake.run_launcher(FAKE_RC="ABRT 1 143 137")
    assert arg(fake.calls("sbatch")[0]["argv"], "--exclude") == "n1", fake.launcher_log()


def test_a_rank_that_crashed_by_itself_blames_its_node(fake, tmp_path):
    # Rank 1 (node n1) dies of a segmentation fault (139) or a bus error (135, e.g. a memory error)
    # while its task received no signal: no peer and no srun sends those, so n1 is excluded. The
    # others were stopped by srun (143, 137).
    write_latest(str(tmp_path / "ckpt"), 5)
    for fault in ("SEGV", "BUS"):
        fake.run_launcher(FAKE_RC=f"143 {fault} 143 137")
        log = fake.launcher_log()
        assert "1 rank(s) failed by themselves" in log and "failed nodes: n1" in log, log
        assert arg(fake.calls("sbatch")[-1]["argv"], "--exclude") == "n1", log


def test_watchdog_exits_blame_no_node(fake, tmp_path):
    # A hung collective: every rank's watchdog fires (124), or srun stops the rank first.
    write_latest(str(tmp_path / "ckpt"), 5)
    fake.run_launcher(FAKE_RC="124 TERM 124 143")
    log = fake.launcher_log()
    assert "failed nodes: none identified" in log, log
    assert "every node failed" not in log and "giving up" not in log, log
    assert "hang watchdog" in log
    (sub,) = fake.calls("sbatch")
    assert arg(sub["argv"], "--exclude") is None


def test_resubmission_keeps_the_users_settings_and_drops_the_jobs_variables(fake, tmp_path):
    write_latest(str(tmp_path / "ckpt"), 5)
    info = ("JobId=4242 JobName=fake Account=proj QOS=high Partition=mi300x TimeLimit=12:00:00 "
            "Reservation=maint Features=mi300x&ib TresPerNode=gres:gpu:8 Command=/somewhere/run_mi300x.sh")
    fake.run_launcher(FAKE_RC="0 0 0 1", FAKE_JOB_INFO=info, SBATCH_ARGS="--mail-type=END --comment=zaya",
                      SRUN_ARGS="--cpu-bind=none", SRUN_MPI="pmix", SBATCH_PARTITION="mi300x",
                      SLURM_CPUS_PER_TASK="4", SRUN_CPUS_PER_TASK="4", SLURM_RESTART_COUNT="1",
                      SLURM_JOB_PARTITION="mi300x", SLURM_STEP_ID="4294967291")
    (sub,) = fake.calls("sbatch")
    argv = sub["argv"]
    for flag, value in (("--partition", "mi300x"), ("--account", "proj"), ("--qos", "high"),
                        ("--reservation", "maint"), ("--constraint", "mi300x&ib"), ("--gres", "gpu:8"),
                        ("--time", "12:00:00"), ("--exclude", "n2"), ("--nodes", "2"), ("--ntasks-per-node", "2"),
                        ("--mail-type", "END"), ("--comment", "zaya")):
        assert arg(argv, flag) == value, (flag, argv)
    env = sub["env"]
    # The user's settings survive ...
    assert env["SRUN_ARGS"] == "--cpu-bind=none" and env["SRUN_MPI"] == "pmix"
    assert env["SBATCH_ARGS"] == "--mail-type=END --comment=zaya" and env["SBATCH_PARTITION"] == "mi300x"
    assert env["SLURM_CONF"] == "/etc/slurm/fake.conf"
    # ... this job's variables do not.
    for v in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE",
              "SLURM_NNODES", "SLURM_CPUS_ON_NODE", "SLURM_CPUS_PER_TASK", "SRUN_CPUS_PER_TASK", "SLURM_RESTART_COUNT",
              "SLURM_SUBMIT_DIR", "SLURM_STEP_ID", "SLURM_JOB_PARTITION", "MASTER_ADDR", "MASTER_PORT"):
        assert v not in env, v
    assert env["ZAYA_RESTART"] == "1" and env["ZAYA_EXCLUDE"] == "n2" and env["ZAYA_FAILED_AT"] == "5"
    assert "carries: " in fake.launcher_log()


def test_resubmission_keeps_cpus_memory_gpus_and_mail(fake, tmp_path):
    """What sbatch exports for --cpus-per-task, --mem(-per-cpu/-gpu), --gpus(-per-task), --cpus-per-gpu,
    and the job's mail settings come back as flags: the variables themselves are this job's and are
    dropped, and without --cpus-per-task the new ranks would get one CPU each."""
    write_latest(str(tmp_path / "ckpt"), 5)
    info = "JobId=4242 JobName=fake MailUser=ops@example.org MailType=END,FAIL Command=/somewhere/run_mi300x.sh"
    fake.run_launcher(FAKE_RC="0 0 0 1", FAKE_JOB_INFO=info, SLURM_CPUS_PER_TASK="16", SLURM_MEM_PER_NODE="512000",
                      SLURM_GPUS_PER_TASK="1", SLURM_CPUS_PER_GPU="8")
    (sub,) = fake.calls("sbatch")
    for flag, value in (("--cpus-per-task", "16"), ("--mem", "512000"), ("--gpus-per-task", "1"),
                        ("--cpus-per-gpu", "8"), ("--mail-type", "END,FAIL"), ("--mail-user", "ops@example.org"),
                        ("--mem-per-cpu", None), ("--gpus", None)):
        assert arg(sub["argv"], flag) == value, (flag, sub["argv"])
    assert "SLURM_CPUS_PER_TASK" not in sub["env"] and "SLURM_MEM_PER_NODE" not in sub["env"]
    fake.run_launcher(FAKE_RC="0 0 0 1", FAKE_JOB_INFO="JobId=4242 MailType=NONE Command=/x/run_mi300x.sh")
    (sub,) = fake.calls("sbatch")
    assert arg(sub["argv"], "--mail-type") is None and arg(sub["argv"], "--mail-user") is None


def test_chained_phase_keeps_sbatch_args(fake, tmp_path):
    # Phase 1 of the recipe completes; its ON_SUCCESS_CMD submits phase 2 with the recipe's SBATCH_ARGS.
    root = tmp_path / "root"
    fake.run_launcher(CKPT_DIR=str(root / "phase1"), END_ITER="476837", FAKE_WRITES_ITER="476837",
                      CKPT_ROOT=str(root), DATA_ROOT="/data/z", TOKENIZER_MODEL="/tok",
                      SBATCH_ARGS="--account=proj --partition=mi300x", SRUN_ARGS="--cpu-bind=none",
                      ON_SUCCESS_CMD=f"bash {RECIPE} phase2 --chain")
    log = fake.launcher_log()
    assert "training finished" in log, log
    (sub,) = fake.calls("sbatch")
    assert sub["argv"][:4] == ["--job-name=zaya1-base-p2", f"--chdir={REPO}", "--account=proj", "--partition=mi300x"]
    assert sub["env"]["SRUN_ARGS"] == "--cpu-bind=none" and "SLURM_JOB_ID" not in sub["env"]


def test_no_checkpoint_folder_never_requeues(fake):
    r = fake.run_launcher(CKPT_DIR="", TRAIN_ITERS="10")
    log = fake.launcher_log()
    assert r.returncode == 0, log
    assert not [c for c in fake.calls("scontrol") if c["argv"][:1] == ["requeue"]], log
    assert "requeueing" not in log
    assert "CKPT_DIR is empty" in log and "training finished" in log


def test_finished_run_starts_no_training(fake, tmp_path):
    marker = tmp_path / "next"
    write_latest(str(tmp_path / "ckpt"), 8)
    r = fake.run_launcher(END_ITER="8", ON_SUCCESS_CMD=f"echo next > {marker}")
    log = fake.launcher_log()
    assert r.returncode == 0, log
    assert fake.training_sruns() == [], log
    assert "already at END_ITER=8" in log and "training finished" in log
    assert marker.read_text().strip() == "next"
    # Not finished yet: it trains.
    write_latest(str(tmp_path / "ckpt"), 7)
    fake.run_launcher(END_ITER="8", FAKE_WRITES_ITER="8")
    assert len(fake.training_sruns()) == 1


def test_a_final_save_stopped_before_the_latest_file_counts_as_the_runs_latest(fake, tmp_path):
    """iter_0000008 (= END_ITER) was published, COMPLETE written after the latest file that still names 4: the
    trainer's --load continues from 8 (format.named_latest), so the launcher must not train again. A complete
    folder the file was written after (the user pointed the file back on purpose) does not count."""
    import time

    from megatron_zaya.checkpoint.format import named_latest
    ckpt = tmp_path / "ckpt"
    for it in (4, 8):
        (ckpt / f"iter_{it:07d}").mkdir(parents=True)
        (ckpt / f"iter_{it:07d}" / "COMPLETE").write_text(f"{it}\n")
        if it == 4:
            time.sleep(0.05)
            write_latest(str(ckpt), 4)
            time.sleep(0.05)
    assert named_latest(str(ckpt)) == 8
    fake.run_launcher(END_ITER="8")
    log = fake.launcher_log()
    assert fake.training_sruns() == [] and "already at END_ITER=8" in log, log
    time.sleep(0.05)
    write_latest(str(ckpt), 4)             # written after iter_0000008 was completed: it names the latest
    assert named_latest(str(ckpt)) == 4
    fake.run_launcher(END_ITER="8", FAKE_WRITES_ITER="8")
    assert len(fake.training_sruns()) == 1, fake.launcher_log()


def test_health_check_runs_once_per_node(fake, tmp_path):
    ran = tmp_path / "health"
    write_latest(str(tmp_path / "ckpt"), 5)
    fake.run_launcher(FAKE_RC="0 0 0 1", HEALTH_CHECK_CMD=f"sh -c 'echo $SLURMD_NODENAME >> {ran}'")
    assert sorted(ran.read_text().split()) == ["n1", "n2"]
    hc = [c for c in fake.calls("srun") if "--task" not in c["argv"]]
    assert len(hc) == 1 and "--ntasks=2" in hc[0]["argv"] and "--ntasks-per-node=1" in hc[0]["argv"]
    assert "failed nodes: n2" in fake.launcher_log()


def test_single_node_job_says_what_it_does(fake, tmp_path):
    # The job's only node fails after writing a new checkpoint: restarted, and the node is not excluded
    # (one node failing alone looks like a software error as much as a node fault).
    single = dict(SLURM_JOB_NODELIST="n1", SLURM_JOB_NUM_NODES="1", SLURM_NNODES="1", SLURM_NTASKS="2",
                  SLURM_NPROCS="2", SLURM_NTASKS_PER_NODE="2")
    write_latest(str(tmp_path / "ckpt"), 3)
    fake.run_launcher(FAKE_RC="1", FAKE_WRITES_ITER="5", **single)
    log = fake.launcher_log()
    assert "not excluding it" in log and "failed nodes: none identified" in log, log
    (sub,) = fake.calls("sbatch")
    assert arg(sub["argv"], "--exclude") is None, sub["argv"]
    assert re.search(r"excluding no nodes", log)
    # With a health check that fails there, it is excluded, and the log says so.
    fake.run_launcher(FAKE_RC="1", FAKE_WRITES_ITER="7", HEALTH_CHECK_CMD="false", **single)
    log = fake.launcher_log()
    assert "failed nodes: n1" in log
    assert arg(fake.calls("sbatch")[0]["argv"], "--exclude") == "n1"


def test_a_failure_after_the_time_limit_warning_is_not_requeued(fake, tmp_path):
    # A short job gets SIGUSR1 within seconds. Every rank then fails by itself (exit 2, a bad flag) with no
    # new checkpoint and no SIGTERM: a failure (given up at once here), not a requeue up to MAX_REQUEUES.
    write_latest(str(tmp_path / "ckpt"), 5)
    r = fake.run_launcher(FAKE_USR1="1", FAKE_RC="2", TRAIN_ITERS="10", USR1_REPEAT_SECONDS="1")
    log = fake.launcher_log()
    assert "received SIGUSR1" in log and "a failure, not the time limit" in log, log
    assert "giving up: every node failed before a new checkpoint" in log, log
    assert not [c for c in fake.calls("scontrol") if c["argv"][:1] == ["requeue"]], log
    assert r.returncode == 2
    # The trainer saved and exited after the warning: requeued; at MAX_REQUEUES the unfinished run fails.
    r = fake.run_launcher(FAKE_USR1="1", FAKE_RC="0", FAKE_WRITES_ITER="6", TRAIN_ITERS="10", USR1_REPEAT_SECONDS="1")
    assert [c for c in fake.calls("scontrol") if c["argv"][:1] == ["requeue"]], fake.launcher_log()
    r = fake.run_launcher(FAKE_USR1="1", FAKE_RC="0", FAKE_WRITES_ITER="7", TRAIN_ITERS="10", USR1_REPEAT_SECONDS="1",
                          MAX_REQUEUES="0")
    log = fake.launcher_log()
    assert r.returncode == 3 and "MAX_REQUEUES=0 reached; training is not finished (latest checkpoint: 7)" in log, log


def test_a_warning_during_the_environment_setup_does_not_kill_the_task(fake, tmp_path):
    # SIGUSR1 while a task sources TRAIN_ENV_SETUP (module loads on a busy file system) killed the task
    # (exit 138, no exit record); it is ignored there, and the launcher repeats it once the trainer runs.
    setup = tmp_path / "setup.sh"
    setup.write_text("kill -s USR1 $$\n")
    r = fake.run_launcher(TRAIN_ENV_SETUP=str(setup), FAKE_RC="0", FAKE_WRITES_ITER="10", TRAIN_ITERS="10")
    log = fake.launcher_log()
    assert r.returncode == 0 and "training finished" in log, log
    records = glob.glob(os.path.join(fake.submit_dir, "logs", "fake-4242", "attempt-0", "exit", "rank-*"))
    assert len(records) == 4 and all(open(f).read().split()[2] == "0" for f in records), records


def test_a_master_port_in_use_on_the_first_node_moves_on_or_stops_the_job(fake):
    """Rank 0's store must listen on MASTER_PORT of the job's first node (where the batch script runs). Held there
    by another program, rank 0 would fail at start and its node be blamed, or the other ranks join that program: a
    port derived from the job id moves on to the next free one of its parity; a given one stops the job (exit 2)
    before srun, naming it."""
    derived = 20000 + (4242 % 6000) * 2                   # job 4242, attempt 0
    held = []
    try:
        for port in (derived, derived + 2):
            listener = socket.socket()
            try:
                listener.bind(("127.0.0.1", port))
            except OSError:
                pytest.skip(f"port {port} is taken on this machine")
            listener.listen()
            held.append(listener)
        fake.run_launcher(SLURMD_NODENAME="n1")
        assert f"master port {derived} is in use on n1: using {derived + 4}" in fake.launcher_log()
        assert {c["env"]["MASTER_PORT"] for c in fake.training_sruns()} == {str(derived + 4)}
        r = fake.run_launcher(SLURMD_NODENAME="n1", MASTER_PORT=str(derived + 2))
        assert r.returncode == 2 and fake.training_sruns() == []
        assert f"MASTER_PORT={derived + 2} is in use on n1 (rank 0's node)" in r.stderr, r.stderr
        fake.run_launcher(SLURMD_NODENAME="n2")           # another node's ports are not this one's to check
        assert {c["env"]["MASTER_PORT"] for c in fake.training_sruns()} == {str(derived)}
        on_its_address = socket.socket()                  # a program on the node's own address, not on loopback
        held.append(on_its_address)
        on_its_address.bind(("127.0.0.2", derived + 4))
        on_its_address.listen()
        fake.run_launcher(SLURMD_NODENAME="127.0.0.2", MASTER_ADDR="127.0.0.2")
        assert f"master port {derived} is in use on 127.0.0.2: using {derived + 6}" in fake.launcher_log()
    finally:
        for listener in held:
            listener.close()
