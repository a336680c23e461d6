"""run_mi300x_recovery.sh's after_training_step with stand-in Slurm commands (fake_slurm.py, about a second per
case): the time-limit warning on a finished run, srun dying of the warning itself (138), a clean exit before
END_ITER, the exit code of a run stopped by SIGTERM, and no third attempt after two without a new checkpoint.

    python -m pytest -q tests/slurm/test_run_mi300x_step_outcomes.py
"""
from __future__ import annotations

import os

import pytest

from fake_slurm import write_latest


def requeues(fake) -> list:
    return [c for c in fake.calls("scontrol") if c["argv"][:1] == ["requeue"]]


def test_the_time_limit_warning_on_a_finished_run_finishes_it(fake, tmp_path):
    # The trainer wrote its last checkpoint (END_ITER) and exited after Slurm's SIGUSR1: the run is done,
    # ON_SUCCESS_CMD runs, and the job is not requeued.
    marker = tmp_path / "next"
    write_latest(str(tmp_path / "ckpt"), 5)
    r = fake.run_launcher(FAKE_USR1="1", FAKE_RC="0", FAKE_WRITES_ITER="10", TRAIN_ITERS="10",
                          USR1_REPEAT_SECONDS="1", ON_SUCCESS_CMD=f"echo next > {marker}")
    log = fake.launcher_log()
    assert r.returncode == 0 and "training finished" in log, log
    assert not requeues(fake) and "requeueing" not in log, log
    assert marker.read_text().strip() == "next"


def test_srun_dying_of_the_warning_itself_is_requeued(fake, tmp_path):
    # Exit 138 (128 + SIGUSR1) after the warning, with no new checkpoint and no SIGTERM: the warning's doing,
    # so a requeue, not the failure analysis.
    write_latest(str(tmp_path / "ckpt"), 5)
    r = fake.run_launcher(FAKE_USR1="1", FAKE_RC="138", TRAIN_ITERS="10", USR1_REPEAT_SECONDS="1")
    log = fake.launcher_log()
    assert len(requeues(fake)) == 1, log
    assert "a failure, not the time limit" not in log and not fake.calls("sbatch"), log
    assert r.returncode == 0, log


def test_a_clean_exit_before_end_iter_is_requeued_not_finished(fake, tmp_path):
    marker = tmp_path / "next"
    write_latest(str(tmp_path / "ckpt"), 2)
    r = fake.run_launcher(FAKE_RC="0", FAKE_WRITES_ITER="6", TRAIN_ITERS="10", ON_SUCCESS_CMD=f"echo next > {marker}")
    log = fake.launcher_log()
    assert "exited cleanly before END_ITER=10" in log and "training finished" not in log, log
    assert len(requeues(fake)) == 1 and not marker.exists(), log
    assert r.returncode == 0


def arg(argv: list[str], flag: str) -> str | None:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(flag + "=")]
    return values[-1] if values else None


def test_the_health_check_matches_whole_node_names(fake, tmp_path):
    # The check fails on n1 only; n10's "OK:n10" must not pass for n1.
    write_latest(str(tmp_path / "ckpt"), 5)
    fake.run_launcher(FAKE_RC="143", SLURM_JOB_NODELIST="n1,n10",
                      HEALTH_CHECK_CMD='[ "$SLURMD_NODENAME" != n1 ]')
    log = fake.launcher_log()
    assert "failed nodes: n1" in log, log
    (sub,) = fake.calls("sbatch")
    assert arg(sub["argv"], "--exclude") == "n1", sub["argv"]


def test_a_restart_keeps_the_nodes_excluded_before_and_lists_each_once(fake, tmp_path):
    write_latest(str(tmp_path / "ckpt"), 5)
    fake.run_launcher(FAKE_RC="0 0 0 1", ZAYA_RESTART="1", ZAYA_EXCLUDE="n9", ZAYA_FAILED_AT="4")
    (sub,) = fake.calls("sbatch")
    assert arg(sub["argv"], "--exclude") == "n9,n2" and sub["env"]["ZAYA_EXCLUDE"] == "n9,n2", sub["argv"]
    fake.run_launcher(FAKE_RC="0 0 0 1", EXCLUDE_NODES="n2")
    (sub,) = fake.calls("sbatch")
    assert arg(sub["argv"], "--exclude") == "n2", sub["argv"]


def test_a_second_failure_at_the_same_checkpoint_gives_up(fake, tmp_path):
    write_latest(str(tmp_path / "ckpt"), 5)
    r = fake.run_launcher(FAKE_RC="0 0 0 1", ZAYA_RESTART="1", ZAYA_FAILED_AT="5")
    log = fake.launcher_log()
    assert "giving up: failed again at the same checkpoint (5)" in log and not fake.calls("sbatch"), log
    assert r.returncode == 1
    fake.run_launcher(FAKE_RC="0 0 0 1", ZAYA_RESTART="1", ZAYA_FAILED_AT="4")
    assert len(fake.calls("sbatch")) == 1, fake.launcher_log()


def test_the_last_allowed_restart_is_used_and_then_it_gives_up(fake, tmp_path):
    write_latest(str(tmp_path / "ckpt"), 5)
    fake.run_launcher(FAKE_RC="0 0 0 1", ZAYA_RESTART="2", ZAYA_FAILED_AT="4", MAX_RESTARTS="3")
    (sub,) = fake.calls("sbatch")
    assert sub["env"]["ZAYA_RESTART"] == "3"
    r = fake.run_launcher(FAKE_RC="0 0 0 1", ZAYA_RESTART="3", ZAYA_FAILED_AT="4", MAX_RESTARTS="3")
    log = fake.launcher_log()
    assert "giving up: MAX_RESTARTS=3 restarts already used" in log and not fake.calls("sbatch"), log
    assert r.returncode == 1


def test_unset_and_unlimited_job_settings_are_not_carried(fake, tmp_path):
    write_latest(str(tmp_path / "ckpt"), 5)
    info = ("JobId=4242 JobName=fake Account=proj Reservation=(null) QOS=N/A TimeLimit=UNLIMITED "
            "Command=/somewhere/run_mi300x.sh")
    fake.run_launcher(FAKE_RC="0 0 0 1", FAKE_JOB_INFO=info)
    (sub,) = fake.calls("sbatch")
    argv = sub["argv"]
    assert arg(argv, "--account") == "proj", argv
    assert arg(argv, "--reservation") is None and arg(argv, "--qos") is None and arg(argv, "--time") is None, argv


@pytest.mark.parametrize("fault", ["132", "136"])
def test_an_illegal_instruction_or_arithmetic_fault_blames_its_node(fake, tmp_path, fault):
    # 132 (SIGILL) and 136 (SIGFPE) with no signal received: faults of the rank's own execution.
    write_latest(str(tmp_path / "ckpt"), 5)
    fake.run_launcher(FAKE_RC=f"143 {fault} 143 137")
    log = fake.launcher_log()
    assert "1 rank(s) failed by themselves (1@n1:" in log and "failed nodes: n1" in log, log
    assert arg(fake.calls("sbatch")[0]["argv"], "--exclude") == "n1"


SINGLE_NODE = dict(SLURM_JOB_NODELIST="n1", SLURM_JOB_NUM_NODES="1", SLURM_NNODES="1", SLURM_NTASKS="2",
                   SLURM_NPROCS="2", SLURM_NTASKS_PER_NODE="2")


def test_a_health_check_that_hangs_on_the_only_node_excludes_it(fake, tmp_path):
    """A wedged GPU: the check never answers, and HEALTH_CHECK_TIMEOUT ends it. That is a failure of the node (it
    was taken for a check that ran nowhere)."""
    write_latest(str(tmp_path / "ckpt"), 3)
    fake.run_launcher(FAKE_RC="1", FAKE_WRITES_ITER="7", HEALTH_CHECK_CMD="sleep 30", HEALTH_CHECK_TIMEOUT="1",
                      **SINGLE_NODE)
    (sbatch,) = fake.calls("sbatch")
    assert "--exclude=n1" in sbatch["argv"], fake.launcher_log()


def test_a_health_check_that_fails_on_every_node_excludes_none(fake, tmp_path):
    """On a multi-node job, a check that fails everywhere (a typo in it) says more about the check than the nodes:
    excluding every node would leave the resubmission nowhere to run."""
    write_latest(str(tmp_path / "ckpt"), 3)
    fake.run_launcher(FAKE_RC="0 0 1 0", FAKE_WRITES_ITER="7", HEALTH_CHECK_CMD="no-such-check")
    log = fake.launcher_log()
    assert "the health check failed on every node: taken for a fault of the check" in log, log
    (sbatch,) = fake.calls("sbatch")
    assert [a for a in sbatch["argv"] if a.startswith("--exclude")] == ["--exclude=n2"], log


def test_two_attempts_in_a_row_without_a_new_checkpoint_are_not_requeued_again(fake, tmp_path):
    """The warning came before the trainer could save (a --time shorter than its start-up plus the warning's
    lead): the first such attempt is requeued, the next at the same checkpoint is not (MAX_REQUEUES attempts
    would all end alike). A new checkpoint in between starts the count again."""
    write_latest(str(tmp_path / "ckpt"), 5)
    stalled = os.path.join(fake.submit_dir, "logs", "fake-4242", "requeued-without-a-new-checkpoint")
    usr1 = dict(FAKE_USR1="1", FAKE_RC="0", TRAIN_ITERS="10", USR1_REPEAT_SECONDS="1")
    fake.run_launcher(**usr1)
    assert len(requeues(fake)) == 1 and open(stalled).read().strip() == "5", fake.launcher_log()
    r = fake.run_launcher(**usr1, SLURM_RESTART_COUNT="1", keep_logs=True)         # the requeued attempt
    log = fake.launcher_log()
    assert not requeues(fake) and r.returncode == 3, log
    assert "not requeueing: this attempt and the one before ended without a new checkpoint (latest: 5)" in log, log
    # with a checkpoint written by the attempt: requeued, and the count starts again
    r = fake.run_launcher(**usr1, FAKE_WRITES_ITER="6", SLURM_RESTART_COUNT="2", keep_logs=True)
    assert len(requeues(fake)) == 1 and not os.path.exists(stalled), fake.launcher_log()
