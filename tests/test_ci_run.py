""".ci/run, CI's entry point, run on a copy of itself with a stand-in install script and a stand-in python3
whose "pytest" leaves a process running in its group: pytest's exit status is the script's, and a signal
that stops the script (a CI timeout or cancel) ends the tests too, so nothing holds the log's pipe open."""
import os
import shutil
import signal
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STANDIN_PYTHON = r'''#!/bin/bash
case " $* " in
  *" pytest "*)
    echo $$ > "$STANDIN_PID_FILE"
    [[ -n ${STANDIN_IGNORES_TERM:-} ]] && trap '' TERM     # inherited by the sleep: only SIGKILL ends them
    [[ -n ${STANDIN_EXIT:-} ]] && exit "$STANDIN_EXIT"
    sleep 60 &                                             # a test's worker, holding stdout
    echo "tests running"
    wait ;;
  *) exit 0 ;;
esac
'''


def _ci_copy(tmp_path, **env):
    repo, bin_dir = tmp_path / "repo", tmp_path / "bin"
    (repo / ".ci").mkdir(parents=True)
    (repo / "scripts").mkdir()
    bin_dir.mkdir()
    shutil.copy(os.path.join(ROOT, ".ci", "run"), repo / ".ci" / "run")
    (repo / "scripts" / "install.sh").write_text("echo installed\n")
    (bin_dir / "python3").write_text(STANDIN_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               STANDIN_PID_FILE=str(tmp_path / "pytest.pid"), **env)
    return subprocess.Popen(["bash", str(repo / ".ci" / "run")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True)


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _stopped_by_signals(tmp_path, signals, **env):
    """The script's group gets each signal in turn (0.3 s apart); its output, exit status and seconds taken."""
    ci = _ci_copy(tmp_path, **env)
    standin = None
    try:
        for line in ci.stdout:
            if line == "tests running\n":
                break
        standin = int((tmp_path / "pytest.pid").read_text())
        start = time.time()
        for number, signum in enumerate(signals):
            if number:
                time.sleep(0.3)
            os.killpg(ci.pid, signum)
        out, _ = ci.communicate(timeout=15)     # end of file: nothing holds the pipe any more
        took = time.time() - start
        deadline = time.time() + 2
        while _running(standin) and time.time() < deadline:
            time.sleep(0.02)
        assert not _running(standin), "the stand-in pytest runs on"
        return out, ci.returncode, took
    finally:
        for group in (ci.pid, standin):
            try:
                if group is not None:
                    os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        ci.wait()


def test_pytest_exit_status_is_the_scripts(tmp_path):
    ci = _ci_copy(tmp_path, STANDIN_EXIT="3")
    out, _ = ci.communicate(timeout=15)
    assert ci.returncode == 3 and "installed" in out, out


def test_a_cancelled_ci_run_ends_the_tests(tmp_path):
    out, status, _ = _stopped_by_signals(tmp_path, [signal.SIGTERM])
    assert status == -signal.SIGTERM and "CI: stopped by SIGTERM: the tests are ended" in out, out


def test_tests_that_ignore_sigterm_are_killed_at_a_second_signal(tmp_path):
    out, status, took = _stopped_by_signals(tmp_path, [signal.SIGINT, signal.SIGTERM], STANDIN_IGNORES_TERM="1")
    assert status == -signal.SIGINT and took < 4, (status, took, out)      # not the 5 s timer
