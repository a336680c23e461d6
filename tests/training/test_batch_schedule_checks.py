"""training.batch_schedule: --rampup-batch-size START INCREMENT SAMPLES is checked as a whole (three positive
values; the increments must land on the global batch), and a ramp-up that starts at the global batch is no
ramp-up."""
import pytest

from megatron_zaya.training.batch_schedule import BatchSizeSchedule


@pytest.mark.parametrize("rampup, message", [
    ([4, 4], "START INCREMENT SAMPLES"),
    ([4, 4, 100, 1], "START INCREMENT SAMPLES"),
    ([0, 4, 100], "must be positive"),
    ([4, 0, 100], "must be positive"),
    ([4, 4, 0], "must be positive"),
    ([4, 5, 100], "global batch 16 minus start 4 is not a multiple of the increment 5"),
    # (-16 % 4 == 0 passed, and every step ran at the global batch, the ramp-up ignored)
    ([32, 4, 100], "the start 32 is above --global-batch-size 16"),
])
def test_bad_rampups_are_refused(rampup, message):
    with pytest.raises(ValueError, match=message):
        BatchSizeSchedule(16, 1, 1, rampup)


def test_a_one_increment_rampup_checks_its_start_size():
    """With one increment (start + increment = global batch) the start is the only size not implied by the global
    batch's check: 2 sequences over micro-batch 4 would run ramp-up steps of zero micro-batches."""
    with pytest.raises(ValueError, match="batch size 2 is not divisible by --micro-batch-size x data-parallel size = 4"):
        BatchSizeSchedule(8, 4, 1, [2, 6, 100])
    assert BatchSizeSchedule(8, 4, 1, [4, 4, 100]).num_micro_batches(0) == 1


def test_a_rampup_that_starts_at_the_global_batch():
    s = BatchSizeSchedule(16, 2, 2, [16, 4, 100])
    assert [s.batch_size(c) for c in (0, 50, 1000)] == [16, 16, 16]
    assert s.iterations_for_samples(100) == 6 and s.samples_consumed(0, 3) == 48
