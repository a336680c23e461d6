"""The watchdog's limit on evaluations and checkpoint saves (--watchdog-pause-seconds): a save into a stalled file
system or an evaluation on a hung peer ends the rank with its stacks and exit code 124, during training, after it
(the final and test evaluations) and under --skip-train."""
import time

from ckpt_harness import flags, run_script, train
from megatron_zaya.training.watchdog import WATCHDOG_EXIT_CODE, Watchdog


def test_a_pause_has_its_own_limit(ckpt_corpus, ckpt_cache, capsys):
    """An evaluation or save that hangs (a stalled file system, a hung peer) fires once it passes
    --watchdog-pause-seconds, naming it; 0 means no limit. The final and test evaluations (after training stopped
    the watchdog) and --skip-train's (never armed) are limited too. The flag reaches the run's watchdog."""
    fired = []
    dog = Watchdog(factor=5, min_seconds=0.2, poll_seconds=0.02, exit_fn=fired.append, pause_seconds=1.0)
    dog.beat()
    with dog.paused():
        time.sleep(0.5)                 # past min_seconds, within the pause limit
    assert not fired
    with dog.paused():
        time.sleep(1.6)
    assert fired == [WATCHDOG_EXIT_CODE]
    assert "an evaluation or checkpoint save has run for" in capsys.readouterr().err
    dog.stop()
    dog = Watchdog(factor=5, min_seconds=0.2, poll_seconds=0.02, exit_fn=fired.append, pause_seconds=0)
    dog.beat()
    with dog.paused():
        time.sleep(0.5)
    assert fired == [WATCHDOG_EXIT_CODE]
    dog.stop()
    fired.clear()         # a pause before the watchdog is armed (--skip-train), or after training stopped it
    for armed in (False, True):
        dog = Watchdog(factor=5, min_seconds=0.2, poll_seconds=0.02, exit_fn=fired.append, pause_seconds=0.3)
        if armed:
            dog.arm(first_iteration_seconds=10.0)
            dog.beat()
            dog.stop()
            time.sleep(0.4)           # past min_seconds: the iteration limit is over with training
            assert not fired
        with dog.paused():
            time.sleep(0.8)
        assert fired == [WATCHDOG_EXIT_CODE], armed
        fired.clear()
        dog.stop()
    rec = train(flags(ckpt_corpus, 1, "--watchdog-pause-seconds", "30", cache=ckpt_cache))
    assert rec.trainer.checkpointer.watchdog.pause_seconds == 30


def test_the_poll_interval_follows_the_shorter_of_the_two_limits():
    """The thread polls at 1/20 of the shorter limit (0.05 to 5 s): a pause limit shorter than the iteration
    limit is checked that often, not at the iteration limit's pace; a pause limit of 0 (none) does not count."""
    polls = {(min_s, pause): Watchdog(min_seconds=min_s, pause_seconds=pause).poll
             for min_s, pause in ((600, 10), (600, 7200), (600, 0), (2, 7200), (600, 0.5))}
    assert polls == {(600, 10): 0.5, (600, 7200): 5.0, (600, 0): 5.0, (2, 7200): 0.1, (600, 0.5): 0.05}
    assert Watchdog(min_seconds=600, pause_seconds=10, poll_seconds=0.02).poll == 0.02


def test_a_final_evaluation_that_hangs_is_ended_by_the_watchdog(ckpt_corpus, ckpt_cache):
    """After training (the watchdog stopped), the final evaluation runs 6 s against --watchdog-pause-seconds 1.5:
    the rank prints its stacks and exits 124 (it ran to the end: a hung peer held the job)."""
    result = run_script(flags(ckpt_corpus, 2, "--eval-iters", "1", "--watchdog-pause-seconds", "1.5",
                              cache=ckpt_cache), timeout=120, CKPT_TEST_SLOW_EVAL=6)
    assert result.returncode == WATCHDOG_EXIT_CODE, result.stderr[-3000:]
    assert "an evaluation or checkpoint save has run for" in result.stderr
