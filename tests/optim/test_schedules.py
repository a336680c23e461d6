"""LR schedules at their boundaries."""
import math
from types import SimpleNamespace

import pytest

from megatron_zaya.optim.schedules import LRSchedule, lr_schedule_from_flags


def test_warmup_then_cosine():
    s = LRSchedule(lr=1.0, min_lr=0.1, warmup=10, decay=110, decay_style="cosine")
    assert s(0) == pytest.approx(0.1)           # first step: lr / warmup
    assert s(9) == pytest.approx(1.0)           # last warmup step reaches the peak
    assert s(10) == pytest.approx(1.0)          # decay starts at the peak
    assert s(60) == pytest.approx(0.1 + 0.9 * 0.5)   # half way: cos(pi/2)
    assert s(110) == pytest.approx(0.1) and s(500) == pytest.approx(0.1)


def test_linear_and_constant():
    lin = LRSchedule(lr=2.0, min_lr=0.0, warmup=0, decay=100, decay_style="linear")
    assert lin(0) == 2.0 and lin(50) == pytest.approx(1.0) and lin(100) == 0.0
    const = LRSchedule(lr=2.0, warmup=5, decay_style="constant")
    assert const(4) == 2.0 and const(10_000) == 2.0


def test_wsd_stable_then_decay():
    s = LRSchedule(lr=1.0, min_lr=0.0, warmup=10, decay=100, decay_style="WSD", wsd_decay=20, wsd_decay_style="linear")
    assert s(10) == 1.0 and s(79) == 1.0        # stable phase
    assert s(80) == 1.0                         # decay starts
    assert s(90) == pytest.approx(0.5)          # linear decay half way
    assert s(100) == 0.0
    cosine = LRSchedule(lr=1.0, warmup=0, decay=100, decay_style="WSD", wsd_decay=20,
                        wsd_decay_style="minus_sqrt")
    assert cosine(85) == pytest.approx(1 - math.sqrt(0.25))
    exponential = LRSchedule(lr=1.0, warmup=0, decay=100, decay_style="WSD", wsd_decay=20,
                             wsd_decay_style="exponential")
    # Megatron-LM's coefficient 2 * 0.5**r - 1 of the decay ratio r: 0.4142 half way (sqrt(2) - 1)
    assert exponential(80) == 1.0 and exponential(90) == pytest.approx(math.sqrt(2) - 1) and exponential(100) == 0.0
    # exponential is the default, as Megatron-LM's --lr-wsd-decay-style
    assert LRSchedule(lr=1.0, decay=100, decay_style="WSD", wsd_decay=20)(90) == pytest.approx(math.sqrt(2) - 1)


def test_inverse_square_root_as_megatron_lm():
    """Megatron-LM's OptimizerParamScheduler after the warmup: max(min_lr, lr * sqrt(max(W, 1)) / sqrt(max(n, 1)))
    while n <= the decay length, min_lr past it (n: the steps taken before this one)."""
    s = LRSchedule(lr=1.0, min_lr=0.05, warmup=4, decay=1000, decay_style="inverse-square-root")
    assert s(3) == 1.0                                   # the warmup's last step (one ahead, as every style)
    assert s(4) == 1.0 and s(16) == pytest.approx(0.5) and s(100) == pytest.approx(0.2)
    assert s(999) == pytest.approx(max(0.05, 2 / math.sqrt(999)))
    assert s(1000) == pytest.approx(2 / math.sqrt(1000)) and s(1001) == 0.05      # min-lr only past the decay
    floor = LRSchedule(lr=1.0, min_lr=0.1, warmup=4, decay=1000, decay_style="inverse-square-root")
    assert floor(900) == 0.1                             # 2 / sqrt(900) = 0.067 is below --min-lr
    no_warmup = LRSchedule(lr=1.0, decay=100, decay_style="inverse-square-root")
    assert no_warmup(0) == 1.0 and no_warmup(1) == 1.0 and no_warmup(4) == pytest.approx(0.5)


def test_inverse_square_root_without_warmup_counts_samples_under_train_iters():
    """Without a warmup Megatron-LM's lr is lr / sqrt(samples consumed) (its floors are one sample), under
    --train-iters too: iteration k of global batch 4 trains at lr / sqrt(4 (k - 1)), not lr / sqrt(k - 1)
    (the first step at lr). With a warmup the two units agree, and under --train-samples nothing changes."""
    flags = _flags(train_iters=100, lr_decay_style="inverse-square-root", global_batch_size=4)
    s = lr_schedule_from_flags(1.0, flags, 100)
    assert [s(k) for k in range(5)] == pytest.approx([1.0, 1 / math.sqrt(4), 1 / math.sqrt(8), 1 / math.sqrt(12),
                                                      1 / math.sqrt(16)])
    warm = lr_schedule_from_flags(1.0, _flags(train_iters=100, lr_decay_style="inverse-square-root",
                                              lr_warmup_iters=4, global_batch_size=4), 100)
    assert warm(16) == pytest.approx(0.5)                # sqrt(16 samples / 64 samples), as in samples
    samples = lr_schedule_from_flags(1.0, _flags(train_samples=400, lr_decay_style="inverse-square-root",
                                                 global_batch_size=4), 0)
    assert samples(0) == 1.0 and samples(4) == pytest.approx(0.5)


@pytest.mark.parametrize("kwargs, flag", [
    (dict(decay_style="bogus"), "--lr-decay-style"),
    (dict(min_lr=2.0), "--min-lr"),
    (dict(decay_style="WSD", decay=100, wsd_decay=0), "--lr-wsd-decay-iters"),
])
def test_bad_schedules_name_the_flag(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        LRSchedule(lr=1.0, **kwargs)


def _flags(**kw):
    base = dict(train_iters=None, train_samples=None, min_lr=0.0, lr_decay_style="linear", lr_wsd_decay_style="linear",
                lr_warmup_iters=0, lr_decay_iters=None, lr_wsd_decay_iters=0, lr_warmup_samples=0,
                lr_decay_samples=None, lr_wsd_decay_samples=0, lr_warmup_fraction=None, global_batch_size=1)
    return SimpleNamespace(**{**base, **kw})


def test_sample_flags_go_with_train_samples_and_iteration_flags_with_train_iters():
    by_samples = lr_schedule_from_flags(1.0, _flags(train_samples=1000, lr_warmup_samples=100), total_iters=62)
    assert (by_samples.unit, by_samples.warmup, by_samples.decay) == ("samples", 100, 1000)   # decay: the run
    assert by_samples(0, 16) == pytest.approx(0.16) and by_samples(96, 16) == 1.0   # a step that crosses the end
    assert by_samples(550) == pytest.approx(0.5)
    by_iters = lr_schedule_from_flags(1.0, _flags(train_iters=50, lr_warmup_iters=10), total_iters=50)
    assert (by_iters.unit, by_iters.warmup, by_iters.decay) == ("iters", 10, 50)
    # --lr-warmup-fraction: of the decay length, in the run's unit
    assert lr_schedule_from_flags(1.0, _flags(train_samples=1000, lr_warmup_fraction=0.1), 62).warmup == 100
    with pytest.raises(ValueError, match="--lr-warmup-iters does not go with --train-samples"):
        lr_schedule_from_flags(1.0, _flags(train_samples=1000, lr_warmup_iters=5), 62)
    with pytest.raises(ValueError, match="--lr-decay-samples does not go with --train-iters"):
        lr_schedule_from_flags(1.0, _flags(train_iters=50, lr_decay_samples=500), 50)
    with pytest.raises(ValueError, match="--lr-warmup-fraction and --lr-warmup-iters exclude each other"):
        lr_schedule_from_flags(1.0, _flags(train_iters=50, lr_warmup_iters=5, lr_warmup_fraction=0.1), 50)
    with pytest.raises(ValueError, match="--lr-wsd-decay-samples=0"):
        lr_schedule_from_flags(1.0, _flags(train_samples=1000, lr_decay_style="WSD"), 62)


def test_weight_decay_increment_styles():
    from megatron_zaya.optim.schedules import weight_decay_schedule_from_flags
    flags = _flags(train_iters=100, weight_decay_incr_style="linear", start_weight_decay=0.0, end_weight_decay=0.2)
    linear = weight_decay_schedule_from_flags(flags, 100)
    assert linear(0) == 0.0 and linear(50) == pytest.approx(0.1) and linear(100) == linear(500) == 0.2
    flags.weight_decay_incr_style = "cosine"
    cosine = weight_decay_schedule_from_flags(flags, 100)
    assert cosine(0) == pytest.approx(0.0) and cosine(50) == pytest.approx(0.1) and cosine(25) < 0.05
    flags.weight_decay_incr_style = "constant"
    with pytest.raises(ValueError, match="--start-weight-decay needs --weight-decay-incr-style linear or cosine"):
        weight_decay_schedule_from_flags(flags, 100)
    assert weight_decay_schedule_from_flags(_flags(train_iters=100, weight_decay_incr_style="constant",
                                                   start_weight_decay=None, end_weight_decay=None), 100) is None
    with pytest.raises(ValueError, match="needs --end-weight-decay"):
        weight_decay_schedule_from_flags(_flags(train_iters=100, weight_decay_incr_style="linear",
                                                start_weight_decay=0.0, end_weight_decay=None), 100)


def test_a_decay_shorter_than_the_warmup_names_the_flags_that_set_them():
    """--train-iters 20 over a config's --lr-warmup-iters 30: the decay is the run's length (no --lr-decay-iters
    given), so the error names --train-iters and where the warmup came from, not a flag the user never gave."""
    flags = _flags(train_iters=20, lr_warmup_iters=30, config="examples/cpu_zaya1_tiny.yaml")
    with pytest.raises(ValueError, match=r"^--train-iters=20 \(the decay's length without --lr-decay-iters\) is "
                                         r"shorter than the warmup, --lr-warmup-iters=30 \(from --config "
                                         r"examples/cpu_zaya1_tiny.yaml unless given\)"):
        lr_schedule_from_flags(1.0, flags, 20)
    with pytest.raises(ValueError, match=r"^--lr-decay-samples=64 is shorter than the warmup, --lr-warmup-samples=80:"):
        lr_schedule_from_flags(1.0, _flags(train_samples=100, lr_decay_samples=64, lr_warmup_samples=80), 0)
