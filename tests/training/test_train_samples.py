"""--train-samples -> iterations as Megatron-LM's update_train_iters (a partial last global batch is
dropped), and the train loader is sized from the schedule so the last step never runs out of data."""
import pytest

from megatron_zaya.arguments import parse_args
from megatron_zaya.training.batch_schedule import BatchSizeSchedule
from megatron_zaya.training.setup import build_and_train
from tests.training.helpers import tiny_run_flags


def test_iterations_for_samples_drop_the_partial_batch():
    constant = BatchSizeSchedule(4, 2, 1)
    assert [constant.iterations_for_samples(n) for n in (3, 4, 10, 12)] == [0, 1, 2, 3]
    ramp = BatchSizeSchedule(4, 2, 1, [2, 2, 4])       # 2, 2, then 4 from 4 consumed samples
    assert [ramp.iterations_for_samples(n) for n in (4, 10, 12, 14)] == [2, 3, 4, 4]
    assert ramp.samples_consumed(0, 4) == 12 and ramp.samples_consumed(4, 2) == 8


def test_iterations_for_samples_equal_stepping_through_every_batch():
    """The full batches after the ramp-up are counted at once: equal to stepping batch by batch (the
    reference), from resumed positions inside and after the ramp-up, and at 30M iterations at once."""
    import random
    rng = random.Random(0)
    for _ in range(200):
        micro, gbs = rng.choice([(1, 8), (2, 8), (1, 12), (4, 32)])
        rampup = rng.choice([None, [micro, micro, rng.randint(1, 300)], [2 * micro, micro, rng.randint(1, 300)]])
        schedule = BatchSizeSchedule(gbs, micro, 1, rampup)
        start, samples = rng.randint(0, 200), rng.randint(0, 2000)
        steps, consumed = 0, start
        while consumed + schedule.batch_size(consumed) <= samples:
            consumed += schedule.batch_size(consumed)
            steps += 1
        assert schedule.iterations_for_samples(samples, start) == steps, (gbs, micro, rampup, start, samples)
    assert BatchSizeSchedule(1, 1, 1).iterations_for_samples(30_000_000) == 30_000_000


@pytest.mark.parametrize("gbs, rampup, consumed, size", [(7, [1, 1, 100], 50, 4), (6, [1, 1, 12345678], 12345678, 6)])
def test_rampup_rounds_the_step_count_as_megatron(gbs, rampup, consumed, size):
    """int(consumed / samples per increment), as Megatron-LM: where the quotient is a whole number (50 / (100 / 6)
    = 3, 12345678 / (12345678 / 5) = 5) the float floor division was one increment behind."""
    assert BatchSizeSchedule(gbs, 1, 1, rampup).batch_size(consumed) == size


@pytest.mark.parametrize("samples, rampup, iterations", [(10, [], 2), (14, ["2", "2", "4"], 4)])
def test_train_samples_not_a_multiple_of_the_batch(tiny_corpus, tmp_path, capsys, samples, rampup, iterations):
    argv = tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": None, "--train-samples": samples,
                                                    "--eval-iters": 0})
    argv += ["--rampup-batch-size", *rampup] if rampup else []
    assert build_and_train(parse_args(argv)) == 0
    out = capsys.readouterr().out
    assert f"iteration {iterations:8d}/{iterations:8d}" in out
    assert f"iteration {iterations + 1:8d}/" not in out


def test_the_lr_schedule_counts_samples_through_a_batch_rampup(tiny_corpus, tmp_path):
    """--train-samples 14 with --rampup-batch-size 2 2 4 runs batches of 2, 2, 4, 4; with
    --lr-warmup-samples 8 the warmup reaches the peak after 8 samples (the third step), as in
    Megatron-LM, whose schedule advances by each step's samples. TensorBoard logs the lr each step used."""
    from tests.training.test_distributed_training import scalar
    tb = tmp_path / "tb"
    argv = tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": None, "--train-samples": 14, "--eval-iters": 0,
                                                    "--lr": "0.008", "--lr-warmup-samples": 8, "--lr-decay-style":
                                                    "constant", "--tensorboard-dir": tb})
    assert build_and_train(parse_args(argv + ["--rampup-batch-size", "2", "2", "4"])) == 0
    assert scalar(tb, "batch-size") == [2, 2, 4, 4]
    assert scalar(tb, "learning-rate") == pytest.approx([0.002, 0.004, 0.008, 0.008], rel=1e-6)


def test_a_ramp_up_counts_global_batches_for_a_resume_under_train_iters(tiny_corpus, tmp_path):
    """--rampup-batch-size goes with --train-samples only (arguments.py), but the run also counts its position in
    global batches (Megatron-LM's scheduler counts samples; iterations are samples / global batch size): steps of
    2, 2, 4 samples with a global batch of 4 are 2.0 global batches, not 3. A resume of that checkpoint with
    --train-iters 6 and --lr-warmup-iters 4 starts the schedule there: iteration 4's lr is LRSchedule's at 2.0."""
    import json

    from megatron_zaya.optim.schedules import LRSchedule
    from tests.training.test_distributed_training import scalar
    save = tmp_path / "ckpt"
    argv = tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": None, "--train-samples": 14, "--eval-iters": 0,
                                                    "--save": save, "--exit-interval": 3})
    assert build_and_train(parse_args(argv + ["--rampup-batch-size", "2", "2", "4"])) == 0
    state = json.loads((save / "iter_0000003" / "metadata.json").read_text())["train_state"]
    assert (state["consumed_samples"], state["scheduled_iterations"]) == (8, 2.0)
    tb = tmp_path / "tb"
    argv = tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": 6, "--eval-iters": 0, "--lr": "0.008",
                                                    "--lr-warmup-iters": 4, "--lr-decay-style": "linear",
                                                    "--load": save, "--tensorboard-dir": tb})
    assert build_and_train(parse_args(argv)) == 0
    schedule = LRSchedule(0.008, warmup=4, decay=6, decay_style="linear")
    expected = [schedule(position) for position in (2.0, 3.0, 4.0)]
    assert expected == pytest.approx([0.006, 0.008, 0.008])
    assert scalar(tb, "learning-rate") == pytest.approx(expected, rel=1e-6)
