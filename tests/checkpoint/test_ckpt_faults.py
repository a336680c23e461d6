"""Injected faults: a full disk during a save, kill -9 in the middle of a save, SIGTERM / SIGUSR1,
corrupt or missing shards, a hung rank (watchdog). Non-finite steps: test_ckpt_nonfinite.py."""
import errno
import json
import os
import re
import signal
import time

import pytest
import torch

from ckpt_harness import flags, run_script, start, train
from megatron_zaya.checkpoint import CheckpointError, inspect_checkpoint, load_full_model_state, saver
from megatron_zaya.checkpoint.format import CheckpointFolder, list_complete, read_latest
from megatron_zaya.training.watchdog import WATCHDOG_EXIT_CODE, Watchdog
from megatron_zaya.checkpoint.save_lock import LOCK_FILE


def _wait_for(predicate, timeout, what, proc=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"process ended ({proc.returncode}) before {what}:\n{out[-2000:]}\n{err[-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _disk_full_at(monkeypatch, target):
    """Make the second write of `target` (a file name; the first save goes through) fail with ENOSPC
    half-way, as a full disk would: the tensor file, a rank JSON, metadata.json, COMPLETE or
    latest_checkpointed_iteration.txt."""
    from megatron_zaya.checkpoint import format as fmt
    calls = []

    def full(path):
        if os.path.basename(path) != target:
            return False
        calls.append(path)
        return len(calls) >= 2

    real_tensors, real_bytes = saver.write_safetensors, fmt.atomic_write_bytes

    def write_tensors(path, tensors, metadata=None):
        if full(path):
            with open(path + ".tmp", "wb") as f:
                f.write(b"\0" * 1000)
            raise OSError(errno.ENOSPC, "No space left on device", path + ".tmp")
        return real_tensors(path, tensors, metadata)

    def write_bytes(path, data):
        if full(path):
            raise OSError(errno.ENOSPC, "No space left on device", path + ".tmp")
        return real_bytes(path, data)

    monkeypatch.setattr(saver, "write_safetensors", write_tensors)
    monkeypatch.setattr(saver, "atomic_write_bytes", write_bytes)     # COMPLETE
    monkeypatch.setattr(fmt, "atomic_write_bytes", write_bytes)       # JSON files, latest (through format)
    return calls


@pytest.mark.parametrize("target", ["rank_00000.safetensors", "rank_00000.json", "metadata.json", "COMPLETE",
                                    "latest_checkpointed_iteration.txt"])
@pytest.mark.parametrize("async_save", [False, True])
def test_disk_full_during_save_keeps_previous_checkpoint(ckpt_corpus, ckpt_cache, tmp_path, monkeypatch, async_save,
                                                         target):
    """A full disk at any write of a save (this rank's files, rank 0's finalize, even the latest file
    after the rename): the save is reported failed and the run exits non-zero naming the previous
    checkpoint, which stays the latest, the newest complete one and loadable; no debris is left."""
    save = str(tmp_path / "full")
    calls = _disk_full_at(monkeypatch, target)
    extra = ["--async-save"] if async_save else []
    with pytest.raises(CheckpointError, match="could not be written.*iter_0000003"):
        train(flags(ckpt_corpus, 6, "--save", save, "--save-interval", "3", *extra, cache=ckpt_cache))
    assert len(calls) == 2
    assert read_latest(save) == 3 and list_complete(save) == [3]
    assert sorted(os.listdir(save)) == [LOCK_FILE, "iter_0000003", "latest_checkpointed_iteration.txt"]   # no debris
    monkeypatch.undo()
    assert inspect_checkpoint(save)["ok"]
    resumed = train(flags(ckpt_corpus, 6, "--save", save, "--load", save, cache=ckpt_cache))
    assert sorted(resumed.losses) == [4, 5, 6] and read_latest(save) == 6


def test_async_outcome_is_the_same_on_every_rank(tmp_path):
    """Rank 0's finalize fails after every rank wrote its files: with the agreement at wait() both
    ranks record the save as failed (rank 1 alone would have recorded a success)."""
    import threading
    from megatron_zaya.checkpoint.format import Entry
    barrier, flags_seen = threading.Barrier(2), {}

    def agree_as(rank):
        def agree(flag):
            flags_seen[rank] = flag
            barrier.wait()
            result = all(flags_seen.values())
            barrier.wait()
            return result
        return agree

    writers = [saver.CheckpointWriter(str(tmp_path), r, 2, "run", finalize_timeout=30) for r in range(2)]

    def no_marker(stage, path):
        if stage == "before_marker":
            raise OSError(errno.ENOSPC, "No space left on device", path)
    writers[0].fault_hook = no_marker
    own = {}

    def rank(r):
        entry = Entry(f"model/w{r}", torch.full((4,), float(r)), [4], [[[0, 4]]])
        writers[r].save_async(5, [entry], {}, {})
        writers[r]._thread.join(60)
        own[r] = writers[r]._pending[1]                     # what this rank alone knows
        writers[r].wait(agree=agree_as(r))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert own == {0: False, 1: True}
    assert writers[0].completed == writers[1].completed == [(5, False)]
    assert list_complete(str(tmp_path)) == [] and read_latest(str(tmp_path)) is None
    assert not os.listdir(str(tmp_path))                   # rank 0 removed the failed save's folder


def test_a_ctrl_c_while_waiting_for_a_background_save_does_not_abandon_it(tmp_path):
    """A second Ctrl-C raises KeyboardInterrupt wherever the main thread is, here in the wait for the async
    save. Thread.join interrupted that way marks the thread as ended while it still writes (CPython 3.11),
    so close()'s wait returned at once: the save was reported failed and its process exit cut it short.
    The wait is on an event the save sets: after the interrupt, waiting again gets the complete save."""
    import threading
    from megatron_zaya.checkpoint.format import Entry

    writer = saver.CheckpointWriter(str(tmp_path), 0, 1, "run", finalize_timeout=30)
    reached, release = threading.Event(), threading.Event()
    writer.fault_hook = lambda stage, path: (reached.set(), release.wait(60)) if stage == "before_marker" else None
    writer.save_async(5, [Entry("model/w", torch.ones(4), [4], [[[0, 4]]])], {}, {})
    assert reached.wait(60)                                 # the save is held there until released
    timer = threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT))
    with pytest.raises(KeyboardInterrupt):                  # (the timer starts inside: its interrupt is caught)
        timer.start()
        writer.wait(timeout=30)
    timer.join()
    assert writer.in_flight                                 # still writing
    release.set()
    assert writer.wait(timeout=30) == (5, True)
    assert list_complete(str(tmp_path)) == [5] and read_latest(str(tmp_path)) == 5


def test_kill9_during_save_leaves_previous_latest(ckpt_corpus, ckpt_cache, tmp_path):
    save = str(tmp_path / "killed")
    losses = str(tmp_path / "losses.json")
    proc = start(flags(ckpt_corpus, 6, "--save", save, "--save-interval", "3", cache=ckpt_cache),
                 CKPT_TEST_HANG_SAVE_AT=6, CKPT_TEST_LOSSES=losses)
    try:
        partial = lambda: [n for n in os.listdir(save) if n.startswith("iter_0000006.partial")] if os.path.isdir(save) else []
        _wait_for(lambda: partial() and os.path.exists(os.path.join(save, partial()[0], "rank_00000.safetensors")),
                  90, "the save of iteration 6 to start", proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert read_latest(save) == 3 and list_complete(save) == [3]
    assert inspect_checkpoint(save)["iteration"] == 3 and inspect_checkpoint(save)["ok"]
    resumed = train(flags(ckpt_corpus, 6, "--save", save, "--load", save, cache=ckpt_cache))
    assert resumed.trainer.checkpointer.loaded["iteration"] == 3 and sorted(resumed.losses) == [4, 5, 6]
    assert read_latest(save) == 6 and list_complete(save) == [3, 6]
    assert not [n for n in os.listdir(save) if "partial" in n]          # the dead save's folder is cleaned up


def test_sigusr1_from_outside_saves_exits_zero_and_resumes(ckpt_corpus, ckpt_cache, tmp_path):
    save = str(tmp_path / "sig")
    losses = str(tmp_path / "losses.json")
    proc = start(flags(ckpt_corpus, 500, "--save", save, cache=ckpt_cache), CKPT_TEST_SLOW_STEP=0.05,
                 CKPT_TEST_LOSSES=losses)
    try:
        _wait_for(lambda: os.path.exists(losses) and len(json.load(open(losses))) >= 2, 90, "two iterations", proc)
        os.kill(proc.pid, signal.SIGUSR1)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "exiting: SIGUSR1 received" in out
    saved = read_latest(save)
    assert saved is not None and 2 <= saved < 500
    assert len(json.load(open(losses))) == saved
    resumed = train(flags(ckpt_corpus, saved + 2, "--save", save, "--load", save, cache=ckpt_cache))
    assert resumed.trainer.checkpointer.loaded["iteration"] == saved and sorted(resumed.losses) == [saved + 1, saved + 2]
    assert read_latest(save) == saved + 2


def test_sigterm_mid_iteration_saves_and_stops(ckpt_corpus, ckpt_cache, tmp_path, monkeypatch):
    """The signal arrives in the middle of iteration 3 (in this process): iteration 3 completes, a
    checkpoint is saved, the loop stops; a second SIGTERM during the handling is ignored."""
    from megatron_zaya.training import loop
    original = loop.Trainer.train_step

    def train_step(trainer, micro_batches):
        if trainer.state.iteration + 1 == 3:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        return original(trainer, micro_batches)

    monkeypatch.setattr(loop.Trainer, "train_step", train_step)
    save = str(tmp_path / "term")
    previous = signal.getsignal(signal.SIGTERM)
    rec = train(flags(ckpt_corpus, 10, "--save", save, "--async-save", cache=ckpt_cache))
    assert signal.getsignal(signal.SIGTERM) is previous                 # handlers restored at the end
    assert sorted(rec.losses) == [1, 2, 3] and rec.trainer.stop_requested == "SIGTERM received"
    assert read_latest(save) == 3 and list_complete(save) == [3]
    monkeypatch.setattr(loop.Trainer, "train_step", original)
    straight = train(flags(ckpt_corpus, 10, "--exit-interval", "5", cache=ckpt_cache))
    resumed = train(flags(ckpt_corpus, 10, "--exit-interval", "5", "--load", save, cache=ckpt_cache))
    assert resumed.losses == {4: straight.losses[4], 5: straight.losses[5]}


@pytest.mark.parametrize("kind", ["interval", "non-persistent"])
def test_sigterm_during_a_save_stops_after_it(ckpt_corpus, ckpt_cache, tmp_path, monkeypatch, kind):
    """SIGTERM while iteration 3's checkpoint is written: the run stops after that save, with no other step and
    no other save (it trained iteration 4 and saved again, which could overrun the time limit's grace period);
    a non-persistent one is kept as persistent."""
    from megatron_zaya.checkpoint.saver import CheckpointWriter
    original = CheckpointWriter.save_sync

    def save_sync(writer, iteration, *args, **kwargs):
        if iteration == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(writer, iteration, *args, **kwargs)

    monkeypatch.setattr(CheckpointWriter, "save_sync", save_sync)
    save = str(tmp_path / kind)
    interval = "--save-interval" if kind == "interval" else "--non-persistent-save-interval"
    rec = train(flags(ckpt_corpus, 10, "--save", save, interval, "3", cache=ckpt_cache))
    assert sorted(rec.losses) == [1, 2, 3] and rec.trainer.stop_requested == "SIGTERM received"
    assert list_complete(save) == [3] and not rec.trainer.checkpointer.writer.is_non_persistent(3)


def test_ctrl_c_saves_and_stops_and_a_second_stops_at_once(ckpt_corpus, ckpt_cache, tmp_path, monkeypatch, capfd):
    """Ctrl-C (SIGINT, which torchrun passes on to every rank) mid-iteration 3: the iteration completes, a
    checkpoint is saved, the loop stops. Ctrl-C twice: KeyboardInterrupt at once, the last checkpoint
    (iteration 2) kept. The handler is restored either way."""
    from megatron_zaya.training import loop
    original = loop.Trainer.train_step
    presses = {"n": 1}

    def train_step(trainer, micro_batches):
        if trainer.state.iteration + 1 == 3:
            for _ in range(presses["n"]):
                os.kill(os.getpid(), signal.SIGINT)
        return original(trainer, micro_batches)

    monkeypatch.setattr(loop.Trainer, "train_step", train_step)
    previous = signal.getsignal(signal.SIGINT)
    save = str(tmp_path / "once")
    rec = train(flags(ckpt_corpus, 10, "--save", save, cache=ckpt_cache))
    assert sorted(rec.losses) == [1, 2, 3] and rec.trainer.stop_requested == "SIGINT received"
    assert read_latest(save) == 3 and "Ctrl-C again to stop at once" in capfd.readouterr().err   # fd 2: signals.py
    assert signal.getsignal(signal.SIGINT) is previous
    presses["n"], save = 2, str(tmp_path / "twice")
    with pytest.raises(KeyboardInterrupt):
        train(flags(ckpt_corpus, 10, "--save", save, "--save-interval", "2", cache=ckpt_cache))
    assert read_latest(save) == 2 and list_complete(save) == [2]
    assert signal.getsignal(signal.SIGINT) is previous


def test_ctrl_c_during_a_validation_stops_it_and_saves(ckpt_corpus, ckpt_cache, tmp_path, monkeypatch, capsys):
    """A Ctrl-C during a long periodic validation: the validation stops at its next micro-batch (all ranks
    agree) and the checkpoint is written. It ran on to its end, and torchrun's 30 s after a Ctrl-C ran out
    first: the ranks were killed with nothing saved."""
    from megatron_zaya.model.zaya import ZayaModel
    original, evaluated = ZayaModel.forward, []

    def forward(model, *args, **kwargs):
        if not model.training:
            evaluated.append(1)
            if len(evaluated) == 3:
                os.kill(os.getpid(), signal.SIGINT)
        return original(model, *args, **kwargs)

    monkeypatch.setattr(ZayaModel, "forward", forward)
    save = str(tmp_path / "ckpt")
    rec = train(flags(ckpt_corpus, 10, "--save", save, "--eval-interval", "2", "--eval-iters", "50",
                      cache=ckpt_cache))
    assert len(evaluated) == 3                          # of the 100 micro-batches the validation would read
    assert rec.trainer.stop_requested == "SIGINT received" and read_latest(save) == 2
    assert "validation at iteration 2 stopped: a stop signal came" in capsys.readouterr().out
    # --skip-train (an evaluation-only job): stopped, nothing to save, and not a success (exit 130)
    from megatron_zaya.arguments import parse_args
    from megatron_zaya.training.setup import build_and_train
    evaluated.clear()
    run = parse_args(flags(ckpt_corpus, 10, "--load", save, "--skip-train", "--eval-iters", "50", cache=ckpt_cache))
    assert build_and_train(run) == 130 and len(evaluated) == 3
    out = capsys.readouterr().out
    assert "validation at iteration 2 stopped" in out and "final validation loss" not in out


def test_a_forked_dataloader_worker_leaves_the_signal_to_its_rank():
    """torchrun and Slurm signal a rank's whole process group, its DataLoader workers (forks that inherit
    the handler) too: a worker neither takes the flag nor ends (its rank still reads from it until the
    save), and prints nothing; the rank itself takes the flag."""
    from megatron_zaya.training.signals import SignalMonitor
    monitor = SignalMonitor(rank=0)
    try:
        pid = os.fork()
        if pid == 0:   # the worker: both signals, then its own verdict as the exit status
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
            os._exit(0 if monitor.received is None else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0 and monitor.received is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert monitor.received == "SIGTERM"
    finally:
        monitor.restore()


def test_which_second_signal_stops_at_once():
    """After a Ctrl-C, a second Ctrl-C or a SIGTERM (torchrun turns a person's second Ctrl-C into SIGTERM for
    its ranks) stops at once; after a SIGTERM (Slurm), another SIGTERM or SIGUSR1 is ignored. The handler's
    message with a full or gone stderr pipe: tests/training/test_signal_messages.py."""
    from megatron_zaya.training.signals import SignalMonitor

    for first, second, stops in (("SIGINT", "SIGINT", True), ("SIGINT", "SIGTERM", True),
                                 ("SIGTERM", "SIGTERM", False), ("SIGTERM", "SIGUSR1", False),
                                 ("SIGINT", "SIGUSR1", False)):     # Slurm's time-limit warning: the save goes on
        monitor = SignalMonitor(rank=0)
        try:
            os.kill(os.getpid(), getattr(signal, first))
            assert monitor.received == first
            if stops:
                with pytest.raises(KeyboardInterrupt):
                    os.kill(os.getpid(), getattr(signal, second))
            else:
                os.kill(os.getpid(), getattr(signal, second))
                assert monitor.received == first
        finally:
            monitor.restore()


def test_signal_skips_the_final_evaluation_and_the_save_completes_first(ckpt_corpus, ckpt_cache, tmp_path, monkeypatch,
                                                                        capsys):
    """A preemption signal: the asynchronous checkpoint is waited for at once, and the final
    evaluation (minutes at scale, inside the grace period) does not run."""
    from megatron_zaya.training import loop
    events = []
    original_step, original_evaluate, original_wait = loop.Trainer.train_step, loop.Trainer.evaluate, \
        saver.CheckpointWriter.wait

    def train_step(trainer, micro_batches):
        if trainer.state.iteration + 1 == 2:
            os.kill(os.getpid(), signal.SIGUSR1)
        return original_step(trainer, micro_batches)

    def evaluate(trainer, *args, **kwargs):
        events.append("evaluate")
        return original_evaluate(trainer, *args, **kwargs)

    def wait(writer, *args, **kwargs):
        outcome = original_wait(writer, *args, **kwargs)
        if outcome is not None:
            events.append(outcome)
        return outcome

    monkeypatch.setattr(loop.Trainer, "train_step", train_step)
    monkeypatch.setattr(loop.Trainer, "evaluate", evaluate)
    monkeypatch.setattr(saver.CheckpointWriter, "wait", wait)
    save = str(tmp_path / "usr1")
    rec = train(flags(ckpt_corpus, 10, "--save", save, "--async-save", "--eval-iters", "1", cache=ckpt_cache))
    assert sorted(rec.losses) == [1, 2] and rec.trainer.stop_requested == "SIGUSR1 received"
    assert events == [(2, True)]
    assert "skipping the final evaluation (SIGUSR1 received)" in capsys.readouterr().out
    assert read_latest(save) == 2 and inspect_checkpoint(save)["ok"]


def test_corrupt_or_missing_shard_names_the_file_and_load_falls_back(ckpt_corpus, ckpt_cache, tmp_path):
    save = str(tmp_path / "corrupt")
    train(flags(ckpt_corpus, 4, "--save", save, "--save-interval", "2", cache=ckpt_cache))
    shard = os.path.join(save, "iter_0000004", "rank_00000.safetensors")
    with open(shard, "r+b") as f:
        f.seek(os.path.getsize(shard) - 100)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CheckpointError, match=re.escape(shard) + ": corrupt"):
        load_full_model_state(save)
    report = inspect_checkpoint(save)
    assert not report["ok"] and report["files"]["rank_00000.safetensors"].startswith("corrupt")
    assert report["files"]["rank_00000.json"] == "ok"
    rec = train(flags(ckpt_corpus, 5, "--save", save, "--load", save, cache=ckpt_cache))
    assert rec.trainer.checkpointer.loaded["iteration"] == 2 and sorted(rec.losses) == [3, 4, 5]
    assert read_latest(save) == 5

    os.unlink(os.path.join(save, "iter_0000005", "rank_00000.json"))
    with pytest.raises(CheckpointError, match=re.escape(os.path.join(save, "iter_0000005", "rank_00000.json")) + ": missing"):
        CheckpointFolder(os.path.join(save, "iter_0000005"))
    os.unlink(os.path.join(save, "iter_0000002", "rank_00000.safetensors"))
    with pytest.raises(CheckpointError, match="no loadable checkpoint.*rank_00000"):
        train(flags(ckpt_corpus, 6, "--load", save, cache=ckpt_cache))


def test_watchdog_fires_on_a_stall_and_not_while_paused():
    fired = []
    dog = Watchdog(factor=5, min_seconds=0.3, poll_seconds=0.02, exit_fn=fired.append)
    for _ in range(3):
        dog.beat()
        time.sleep(0.01)
    with dog.paused():
        time.sleep(0.6)
    assert not fired
    dog.beat()
    time.sleep(0.8)
    assert fired == [WATCHDOG_EXIT_CODE]
    dog.stop()


def test_a_pause_is_not_counted_in_the_iteration_nor_makes_it_look_instant(monkeypatch):
    """The loop evaluates after a step's work and before its beat: the iteration's time is its work (0.3 s),
    not the evaluation (counted, it would fire needlessly) nor 0 (the clock restarted at the pause's end: with an
    evaluation every step the median, hence the limit, fell to min_seconds)."""
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    dog = Watchdog(factor=20, min_seconds=0.5, poll_seconds=10.0, exit_fn=lambda code: None)
    dog.beat()
    for _ in range(3):
        clock[0] += 0.3                 # the step
        with dog.paused():
            clock[0] += 5.0             # its evaluation
        dog.beat()
    assert dog.durations == pytest.approx([0.3, 0.3, 0.3]) and dog.timeout() == pytest.approx(6.0)
    with dog.paused():                  # a beat inside a pause restarts the clock when the pause ends
        clock[0] += 1.0
        dog.beat()
        clock[0] += 2.0
    assert dog.last_beat == clock[0]
    dog.stop()


def test_watchdog_limit_is_the_floor_or_factor_times_the_median(monkeypatch):
    """The module's rule: timeout = max(min_seconds, factor x MEDIAN of the recent iteration times). Reference: hand
    arithmetic on a patched monotonic clock. Iterations of 1, 1, 10 s (one slow outlier) with factor 2: the median
    1 s gives 2 s, below the 5 s floor -> 5 s (the outlier would give 20 s as a max, and a lost floor 2 s); then
    4, 4, 40 s -> median 4 s -> 8 s, above the floor. Exact (binary fractions)."""
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])

    def limit_after(durations):
        dog = Watchdog(factor=2, min_seconds=5.0, poll_seconds=60.0, exit_fn=lambda code: None)
        try:
            dog.beat()
            for seconds in durations:
                clock[0] += seconds
                dog.beat()
            assert list(dog.durations) == durations
            return dog.timeout()
        finally:
            dog.stop()

    assert limit_after([1.0, 1.0, 10.0]) == 5.0
    assert limit_after([4.0, 4.0, 40.0]) == 8.0


def test_watchdog_armed_at_start_allows_a_longer_first_iteration():
    fired = []
    dog = Watchdog(factor=5, min_seconds=0.2, poll_seconds=0.02, exit_fn=fired.append)
    dog.arm(first_iteration_seconds=2.0)          # 1.5 s of margin: a loaded machine may oversleep
    time.sleep(0.5)
    assert not fired and dog.timeout() == 2.0      # the first iteration: the startup allowance
    dog.beat()
    assert dog.timeout() == 0.2 and not dog.durations   # then the usual rule; the first one is not typical
    time.sleep(0.5)
    assert fired == [WATCHDOG_EXIT_CODE]
    dog.stop()
    fired.clear()
    dog = Watchdog(factor=5, min_seconds=0.2, poll_seconds=0.02, exit_fn=fired.append)
    dog.arm(first_iteration_seconds=0.3)
    time.sleep(0.6)                                # a hang in the first iteration is caught too
    assert fired == [WATCHDOG_EXIT_CODE]
    dog.stop()


def test_an_iteration_that_trains_nothing_keeps_the_first_steps_allowance():
    """--iterations-to-skip's first iteration (its batch read and dropped) used up the startup allowance: the
    first real step (warm-up, compilation) then had only min_seconds."""
    fired = []
    dog = Watchdog(factor=5, min_seconds=0.2, poll_seconds=0.02, exit_fn=fired.append)
    dog.arm(first_iteration_seconds=2.0)
    dog.beat(trained=False)
    assert dog.timeout() == 2.0 and not dog.durations
    time.sleep(0.5)
    assert not fired
    dog.beat()
    assert dog.timeout() == 0.2 and not dog.durations
    dog.stop()


def _assert_watchdog_dump(stderr: str, rank: int):
    assert f"[rank {rank}] WATCHDOG: no iteration finished" in stderr, stderr[-3000:]
    assert f"[rank {rank}] WATCHDOG: exiting with code {WATCHDOG_EXIT_CODE}" in stderr, stderr[-3000:]


def test_watchdog_dumps_stacks_and_exits_nonzero_on_a_hang(ckpt_corpus, ckpt_cache, tmp_path):
    """A hang in the FIRST iteration: the watchdog is armed when training starts."""
    result = run_script(flags(ckpt_corpus, 6, "--watchdog-min-seconds", "1", "--watchdog-timeout-factor", "5",
                              "--watchdog-first-iteration-seconds", "3", cache=ckpt_cache),
                        timeout=120, CKPT_TEST_HANG_AT=1)
    assert result.returncode == WATCHDOG_EXIT_CODE, result.stderr[-3000:]
    _assert_watchdog_dump(result.stderr, 0)
    assert "--watchdog-first-iteration-seconds 3)" in result.stderr
    assert "train_step" in result.stderr and "Current thread" in result.stderr


def test_watchdog_is_paused_during_evaluation_and_saves(ckpt_corpus, ckpt_cache, tmp_path):
    """An evaluation and a save each far longer than the watchdog's limit do not fire it: 2.5 s each against
    max(1.5 s, 3 x the median iteration), 1.5 s while an iteration takes under 0.5 s (these take ~0.05 s)."""
    result = run_script(flags(ckpt_corpus, 3, "--eval-interval", "3", "--save", str(tmp_path / "s"), cache=ckpt_cache),
                        timeout=120, CKPT_TEST_WATCHDOG="1.5,3,30", CKPT_TEST_SLOW_EVAL=2.5, CKPT_TEST_SLOW_SAVE=2.5)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "WATCHDOG" not in result.stderr and read_latest(str(tmp_path / "s")) == 3


def test_watchdog_two_ranks_one_hangs_both_exit_nonzero_with_stacks(ckpt_corpus, ckpt_cache, tmp_path):
    """Rank 1 hangs in iteration 3: rank 0, stuck in the step's first collective, and rank 1 itself
    each dump every thread's stack and exit with 124; torchrun fails."""
    import subprocess
    import sys
    from ckpt_harness import RUNNER, ROOT, subprocess_env
    from tests.parallel.parallel_launcher import free_port
    env = subprocess_env()
    env.update(CKPT_TEST_HANG_AT="3", CKPT_TEST_HANG_RANK="1", CKPT_TEST_WATCHDOG="2,5")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), RUNNER, *flags(ckpt_corpus, 6, cache=ckpt_cache)]
    result = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert result.returncode != 0
    for rank in (0, 1):
        _assert_watchdog_dump(result.stderr, rank)
    assert result.stderr.count("Current thread") >= 2
    assert "sum_over_data_ranks" in result.stderr            # rank 0's stack: the collective it waits in
    assert "rank 1: hanging in iteration 3" in result.stdout


def test_loading_never_unpickles():
    """No pickle anywhere a checkpoint is read: the checkpoint and inference packages and tools/."""
    from ckpt_harness import ROOT
    scanned = 0
    for sub in ("megatron_zaya/checkpoint", "megatron_zaya/inference", "tools"):
        for dirpath, _, names in os.walk(os.path.join(ROOT, sub)):
            for name in names:
                if name.endswith(".py"):
                    text = open(os.path.join(dirpath, name)).read()
                    scanned += 1
                    assert not re.search(r"import pickle|pickle\.loads?\(|torch\.load\(|import dill|"
                                         r"weights_only\s*=\s*False", text), os.path.join(dirpath, name)
    assert scanned >= 20
