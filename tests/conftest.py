"""Settings for the whole test suite, applied before any test module imports torch."""
import os

# OpenMP threads that wait by sleeping, not spinning. On an idle machine it costs nothing
# (tests/model/test_learning.py: 23.0 s spinning, 23.8 s sleeping); when other processes share the
# 2 cores, spinning threads steal the cores their own peers need (the same test: 122 s vs 26 s).
# Subprocesses the tests start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Several training jobs run in one test process write TensorBoard event files into one folder, named
# events.out.tfevents.<second>.<host>.<pid>.<n> with n counting the writers of the process: within one second,
# writer 10's file sorted before writer 8's, so the next job's events were read first and the earlier job's
# later steps purged as a restart's (a flaky test, by where the counter stood). Real jobs are separate processes.
# From 1,000,000 the counter keeps its number of digits, and the names sort in the order the writers were made.
try:
    from tensorboard.summary.writer import event_file_writer as _event_file_writer
    _event_file_writer._global_uid._value = max(_event_file_writer._global_uid._value, 1_000_000)
except (ImportError, AttributeError):       # (another tensorboard: the names as it makes them)
    pass

import pytest  # noqa: E402  (after the settings above, which must precede torch's import)

SLURM_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slurm")


def pytest_configure(config):
    """Under pytest-xdist (the README runs `-n 2`) the tests of one xdist group run in one worker: the controller
    schedules by group (--dist loadgroup where -n alone chose load) and each worker names its tests by their group,
    which xdist does only for a --dist loadgroup on the command line (its workers parse that, not this choice).
    Nothing happens without xdist or -n."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    if hasattr(config, "workerinput"):
        config.option.loadgroup = True
    elif config.getoption("numprocesses", None) and config.getoption("dist") == "load":
        config.option.dist = "loadgroup"


@pytest.hookimpl(tryfirst=True)    # before xdist's own hook, which names each test by its group
def pytest_collection_modifyitems(config, items):
    """The launcher tests run in one xdist worker, one after another: they share one local Slurm cluster per
    pytest process (tests/slurm/conftest.py), whose nodes lnode1-3 are named in /etc/hosts."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if str(item.path).startswith(SLURM_TESTS + os.sep):
            item.add_marker(pytest.mark.xdist_group("slurm"))


def _unignore_stop_signals() -> None:
    """SIGINT, SIGTERM and SIGUSR1 back to their defaults where something left them ignored: an ignored signal
    is inherited by every program the test process starts (a shell cannot trap it), and Ctrl-C would not raise.
    In full-suite runs of 2026-12-07 one xdist worker behaved as if SIGINT were ignored, cause not found (the three
    signal-timing tests that failed there pass alone)."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        return
    for name, default in (("SIGINT", signal.default_int_handler), ("SIGTERM", signal.SIG_DFL),
                          ("SIGUSR1", signal.SIG_DFL)):
        if signal.getsignal(getattr(signal, name)) is signal.SIG_IGN:
            signal.signal(getattr(signal, name), default)


@pytest.fixture(autouse=True)
def default_stop_signals():
    """Each test starts and ends with the stop signals not ignored (_unignore_stop_signals)."""
    _unignore_stop_signals()
    yield
    _unignore_stop_signals()
