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


@pytest.mark.parametrize("samples, rampup, iterations", [(10, [], 2), (14, ["2", "2", "4"], 4)])
def test_train_samples_not_a_multiple_of_the_batch(tiny_corpus, tmp_path, capsys, samples, rampup, iterations):
    argv = tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": None, "--train-samples": samples,
                                                    "--eval-iters": 0})
    argv += ["--rampup-batch-size", *rampup] if rampup else []
    assert build_and_train(parse_args(argv)) == 0
    out = capsys.readouterr().out
    assert f"iteration {iterations:>7}/{iterations}" in out
    assert f"iteration {iterations + 1:>7}" not in out
