"""run_mi300x.sh after a cancellation (scancel) or preemption, with stand-in Slurm commands (fake_slurm.py).

    python -m pytest -q tests/slurm/test_run_mi300x_cancel.py

Slurm signals the job's step before its batch shell, so the launcher's SIGTERM can come after srun has ended
(in 1 of 14 two-node scancels under the real Slurm). It was only counted then, and the launcher took the
ranks' 143s for a failure and resubmitted the cancelled job. After the time-limit warning, any SIGTERM was
taken for the limit's, so a scancel in the warning's last minutes requeued the job. A SIGTERM is the limit's when
Slurm's RunTime has reached TimeLimit (FAKE_JOB_INFO here): then the job is requeued, not taken for cancelled.
"""
from __future__ import annotations

import os

import pytest

from fake_slurm import write_latest


def term_to_launcher(fake, when: str) -> None:
    """srun runs as usual; the launcher (the training srun's parent) gets SIGTERM right after the training
    srun ends ("after-srun"), or from the failure analysis's health check ("during-analysis"), or not at all
    ("never": the launcher's pid is only written to launcher.pid, for the test's own stand-ins)."""
    real = fake.move_aside("srun")
    pid_file = os.path.join(fake.dir, "launcher.pid")
    fake.install("srun", f'''#!/usr/bin/env bash
trap ':' USR1     # as the real srun, which passes it on
if [[ " $* " != *" --task "* ]]; then
    [[ {when} == during-analysis ]] && kill -s TERM "$(< {pid_file})"
    exec "{real}" "$@"
fi
echo $PPID > {pid_file}
"{real}" "$@"; rc=$?
[[ {when} == after-srun ]] && kill -s TERM $PPID
exit $rc
''')


@pytest.mark.parametrize("when", ["after-srun", "during-analysis"])
def test_a_sigterm_after_srun_ended_is_a_cancellation_not_a_failure(fake, tmp_path, when):
    term_to_launcher(fake, when)
    write_latest(str(tmp_path / "ckpt"), 5)
    r = fake.run_launcher(FAKE_RC="143", TRAIN_ITERS="10", HEALTH_CHECK_CMD="true",
                          FAKE_JOB_INFO=job_info("00:20:00", "01:00:00"))
    log = fake.launcher_log()
    if when == "after-srun":
        assert "stopped by SIGTERM (cancelled, preempted or a node failed;" in log and "not restarting" in log, log
    else:
        assert "health check on every node" in log, log
        assert "SIGTERM came while the failure was analysed (cancelled or preempted); not resubmitting" in log, log
    assert not fake.calls("sbatch"), log
    assert r.returncode == 143, log


def job_info(run: str, limit: str) -> str:
    return f"JobId=4242 JobState=COMPLETING RunTime={run} TimeLimit={limit} Command=/x/run_mi300x.sh"


@pytest.mark.parametrize("run, limit, requeued", [
    ("00:08:20", "00:10:00", False),      # scancel 100 s before the limit
    ("1-00:00:02", "1-00:00:00", True),   # the limit's own SIGTERM (Slurm's check comes a little late)
    ("00:08:20", "UNLIMITED", True),      # unknown: as before, the warning's requeue
])
def test_a_sigterm_after_the_warning_requeues_only_at_the_time_limit(fake, tmp_path, run, limit, requeued):
    term_to_launcher(fake, "after-srun")
    write_latest(str(tmp_path / "ckpt"), 5)
    r = fake.run_launcher(FAKE_USR1="1", FAKE_RC="0", FAKE_WRITES_ITER="7", TRAIN_ITERS="10",
                          USR1_REPEAT_SECONDS="1", FAKE_JOB_INFO=job_info(run, limit))
    log = fake.launcher_log()
    requeues = [c for c in fake.calls("scontrol") if c["argv"][:1] == ["requeue"]]
    assert len(requeues) == int(requeued), log
    assert ("before the limit (cancelled or preempted); not requeueing" in log) == (not requeued), log
    assert not fake.calls("sbatch"), log
    assert r.returncode == 0, log


def test_the_time_limits_sigterm_during_the_failure_analysis_still_resubmits(fake, tmp_path):
    """A rank failed by itself near the time limit, and the limit's SIGTERM came during the health check: the
    failure is resubmitted (without the node), as before, not taken for a cancellation."""
    term_to_launcher(fake, "during-analysis")
    write_latest(str(tmp_path / "ckpt"), 5)
    fake.run_launcher(FAKE_RC="0 0 1 0", TRAIN_ITERS="10", HEALTH_CHECK_CMD="true",
                      FAKE_JOB_INFO=job_info("01:00:31", "01:00:00"))
    log = fake.launcher_log()
    assert "failed nodes: n2" in log and "not resubmitting" not in log, log
    (sbatch,) = fake.calls("sbatch")
    assert "--exclude=n2" in sbatch["argv"], sbatch["argv"]


def test_the_time_limits_sigterm_without_a_warning_requeues(fake, tmp_path):
    """No --signal warning: Slurm's SIGTERM at the limit (RunTime at TimeLimit) stops the trainer, which saves; the
    job is requeued to resume, not taken for a cancellation (also when the SIGTERM reaches the launcher after srun
    has ended)."""
    term_to_launcher(fake, "after-srun")
    write_latest(str(tmp_path / "ckpt"), 5)
    r = fake.run_launcher(FAKE_RC="143", FAKE_WRITES_ITER="7", TRAIN_ITERS="10",
                          FAKE_JOB_INFO=job_info("01:00:31", "01:00:00"))
    log = fake.launcher_log()
    assert "stopped by the time limit's SIGTERM (RunTime at TimeLimit): resuming from the latest" in log, log
    requeues = [c for c in fake.calls("scontrol") if c["argv"][:1] == ["requeue"]]
    assert len(requeues) == 1 and not fake.calls("sbatch"), log
    assert r.returncode == 0, log


def test_the_time_limits_sigterm_without_a_new_checkpoint_does_not_requeue(fake, tmp_path):
    """Each attempt would end at the limit the same way, MAX_REQUEUES times over (a save slower than KillWait, a
    --save-interval longer than the limit)."""
    term_to_launcher(fake, "after-srun")
    write_latest(str(tmp_path / "ckpt"), 5)
    r = fake.run_launcher(FAKE_RC="143", TRAIN_ITERS="10", FAKE_JOB_INFO=job_info("01:00:31", "01:00:00"))
    log = fake.launcher_log()
    assert "without a new checkpoint in this attempt (latest: 5): not requeueing" in log, log
    assert not [c for c in fake.calls("scontrol") if c["argv"][:1] == ["requeue"]] and not fake.calls("sbatch"), log
    assert r.returncode == 143, log


def term_while_the_exit_records_are_logged(fake) -> None:
    """The launcher's SIGTERM arrives while it logs the exit records (after srun ended, before the analysis goes
    on): a tee stand-in sends it."""
    fake.install("tee", '''#!/usr/bin/env bash
text=$(cat); printf '%s\\n' "$text" | /usr/bin/tee "$@"
[[ $text == *"exit records:"* ]] && kill -s TERM $PPID
exit 0
''')


def test_a_late_cancellation_runs_no_health_check(fake, tmp_path):
    term_while_the_exit_records_are_logged(fake)
    write_latest(str(tmp_path / "ckpt"), 5)
    fake.run_launcher(FAKE_RC="143", TRAIN_ITERS="10", HEALTH_CHECK_CMD="true",
                      FAKE_JOB_INFO=job_info("00:20:00", "01:00:00"))
    log = fake.launcher_log()
    assert "health check on every node" not in log and "not resubmitting" in log, log


def test_a_late_time_limit_sigterm_requeues_before_the_restart_limit_is_read(fake, tmp_path):
    """The last allowed restart ends at the limit with every rank's hang watchdog (124: no rank failed by itself),
    after a new checkpoint: a requeue, not "giving up: MAX_RESTARTS"."""
    term_while_the_exit_records_are_logged(fake)
    write_latest(str(tmp_path / "ckpt"), 5)
    fake.run_launcher(FAKE_RC="124", FAKE_WRITES_ITER="7", TRAIN_ITERS="10", ZAYA_RESTART="3", ZAYA_FAILED_AT="4",
                      FAKE_JOB_INFO=job_info("01:00:31", "01:00:00"))
    log = fake.launcher_log()
    requeues = [c for c in fake.calls("scontrol") if c["argv"][:1] == ["requeue"]]
    assert len(requeues) == 1 and "giving up" not in log, log


def test_a_health_check_cut_short_by_the_time_limit_blames_no_node(fake, tmp_path):
    """n2's rank fails by itself near the limit; the health check answers at once on n2 and takes 2 s on n1; the
    limit's SIGTERM comes 0.5 s in, and Slurm ends every step (here: timeout 0.5 around srun). n1 did not answer
    because the check was cut: only n2 is left out."""
    real = fake.move_aside("srun")
    pid_file = os.path.join(fake.dir, "launcher.pid")
    fake.install("srun", f'''#!/usr/bin/env bash
if [[ " $* " != *" --task "* ]]; then
    ( sleep 0.5; kill -s TERM "$(< {pid_file})" ) &
    timeout 0.5 "{real}" "$@"; exit $?
fi
echo $PPID > {pid_file}
exec "{real}" "$@"
''')
    write_latest(str(tmp_path / "ckpt"), 5)
    fake.run_launcher(FAKE_RC="0 0 1 0", TRAIN_ITERS="10", FAKE_WRITES_ITER="7",
                      HEALTH_CHECK_CMD='[ "$SLURMD_NODENAME" != n1 ] || sleep 2',
                      FAKE_JOB_INFO=job_info("01:00:31", "01:00:00"))
    log = fake.launcher_log()
    assert "a SIGTERM came during the health check, which Slurm then ends: its result is not used" in log, log
    (sbatch,) = fake.calls("sbatch")
    assert [a for a in sbatch["argv"] if a.startswith("--exclude")] == ["--exclude=n2"], log


def test_the_time_limits_sigterm_after_the_step_requeues_when_no_rank_failed(fake, tmp_path):
    """Slurm's SIGTERM reached the launcher only after srun had ended: no rank failed by itself, so the limit stopped
    the run, and it is requeued, not resubmitted as a failure. With a rank that failed by itself the resubmission
    goes on; its health check's srun fails as the real Slurm's does past the limit ("job has expired") and blames
    nobody."""
    term_while_the_exit_records_are_logged(fake)
    real = fake.move_aside("srun")
    fake.install("srun", f'''#!/usr/bin/env bash
if [[ " $* " != *" --task "* ]]; then
    echo "srun: error: Slurm job $SLURM_JOB_ID has expired" >&2; exit 1
fi
exec "{real}" "$@"
''')
    write_latest(str(tmp_path / "ckpt"), 5)
    for rc, requeued in (("143", True), ("0 0 1 0", False)):      # the second: n2's rank failed by itself
        fake.run_launcher(FAKE_RC=rc, FAKE_WRITES_ITER="7", TRAIN_ITERS="10", HEALTH_CHECK_CMD="true",
                          FAKE_JOB_INFO=job_info("01:00:31", "01:00:00"))
        log = fake.launcher_log()
        requeues = [c for c in fake.calls("scontrol") if c["argv"][:1] == ["requeue"]]
        assert len(requeues) == requeued and len(fake.calls("sbatch")) == (not requeued), log
        if not requeued:
            assert "the health check ran on no node (its srun exited 1): not used to blame nodes" in log, log
            assert [a for a in fake.calls("sbatch")[0]["argv"] if a.startswith("--exclude")] == ["--exclude=n2"], log


@pytest.mark.parametrize("run, cancelled", [("00:20:00", True), ("01:00:31", False)])
def test_a_sigterm_while_sbatch_resubmits_takes_the_resubmission_back(fake, tmp_path, run, cancelled):
    """n2's rank failed by itself and the launcher resubmits; a scancel's SIGTERM comes while sbatch runs. Under
    the real Slurm it reaches every process of the batch step, sbatch too: here the stand-in sbatch submits (job
    777), then sends SIGTERM to the launcher and to itself, then prints the id (an sbatch the signal killed
    would leave the job queued without telling its id), with a warning on stderr. The new job is cancelled; at
    the time limit it stays."""
    term_to_launcher(fake, "never")
    real = fake.move_aside("sbatch")
    fake.install("sbatch", f'''#!/usr/bin/env bash
id=$(python3 "{real}" "$@")
kill -s TERM "$(< {os.path.join(fake.dir, "launcher.pid")})" $$
echo "sbatch: Warning: your account is near its quota" >&2
echo "$id"
''')
    write_latest(str(tmp_path / "ckpt"), 5)
    fake.run_launcher(FAKE_RC="0 0 1 0", TRAIN_ITERS="10", FAKE_SBATCH_OUTPUT="777;zayatest",
                      FAKE_JOB_INFO=job_info(run, "01:00:00"))
    log = fake.launcher_log()
    assert len(fake.calls("sbatch")) == 1 and "sbatch: Warning: your account is near its quota" in log, log
    assert [c["argv"] for c in fake.calls("scancel")] == ([["777"]] if cancelled else []), log
    assert ("while the resubmission was submitted (cancelled or preempted): cancelled job 777" in log) == cancelled, log
    assert ("resubmitted as job 777 " in log) == (not cancelled), log
