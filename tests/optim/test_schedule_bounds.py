"""optim.schedules' checks at their bounds and the unit each schedule counts in: what a run may ask for
(a warmup as long as the decay, a decoupled LR with its floor at its peak) is accepted, and what it may
not (a negative start, a WSD decay longer than the decay after the warmup) is refused naming the flag."""
from types import SimpleNamespace

import pytest

from megatron_zaya.optim.schedules import (LRSchedule, counts_samples, decoupled_lr_schedule, lr_schedule_from_flags,
                                           weight_decay_schedule_from_flags)


def _flags(**kw):
    base = dict(train_iters=None, train_samples=None, min_lr=0.0, lr_decay_style="linear", lr_wsd_decay_style="linear",
                lr_warmup_iters=0, lr_decay_iters=None, lr_wsd_decay_iters=0, lr_warmup_samples=0,
                lr_decay_samples=None, lr_wsd_decay_samples=0, lr_warmup_fraction=None, global_batch_size=1,
                weight_decay_incr_style="linear", start_weight_decay=0.0, end_weight_decay=0.1)
    return SimpleNamespace(**{**base, **kw})


def test_a_warmup_fraction_of_one_is_all_warmup_and_more_is_refused():
    """--lr-warmup-fraction 1: the warmup is the whole decay length (decay == warmup is allowed), the LR
    reaches its peak at the end; a fraction outside [0, 1] is refused."""
    s = lr_schedule_from_flags(1.0, _flags(train_iters=10, lr_warmup_fraction=1.0), 10)
    assert s.warmup == s.decay == 10 and s(9) == 1.0 and s(0) == pytest.approx(0.1)
    for bad in (1.5, -0.1):
        with pytest.raises(ValueError, match="--lr-warmup-fraction"):
            lr_schedule_from_flags(1.0, _flags(train_iters=10, lr_warmup_fraction=bad), 10)


@pytest.mark.parametrize("kwargs, flag", [
    (dict(warmup_init=-0.1), "--lr-warmup-init"),
    (dict(warmup=10, decay=5, decay_style="linear"), "--lr-decay-iters=5 is shorter than the warmup"),
    (dict(decay_style="WSD", warmup=10, decay=100, wsd_decay=91), "--lr-wsd-decay-iters=91"),
])
def test_bad_schedules_name_the_flag(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        LRSchedule(lr=1.0, **kwargs)
    assert LRSchedule(lr=1.0, decay_style="WSD", warmup=10, decay=100, wsd_decay=90)(10) == 1.0   # the longest WSD


def test_the_schedules_count_samples_only_under_train_samples():
    """A --train-iters run counts global batches even where a train_samples value is also at hand (a
    checkpoint's flags laid over this run's); the weight-decay schedule spans the run in the LR's unit."""
    assert counts_samples(_flags(train_samples=1000)) and not counts_samples(_flags(train_iters=50))
    assert not counts_samples(_flags(train_iters=50, train_samples=1000))
    wd = weight_decay_schedule_from_flags(_flags(train_samples=1000), total_iters=62)
    assert wd.total == 1000 and wd(500) == pytest.approx(0.05)
    assert weight_decay_schedule_from_flags(_flags(train_iters=50), total_iters=50).total == 50
    with pytest.raises(ValueError, match="needs --start-weight-decay >= 0"):
        weight_decay_schedule_from_flags(_flags(train_iters=50, start_weight_decay=-0.1), 50)


def test_a_decoupled_lr_may_hold_constant_at_its_floor():
    base = LRSchedule(lr=1.0, min_lr=0.1, warmup=0, decay=100, decay_style="linear")
    flat = decoupled_lr_schedule(base, SimpleNamespace(decoupled_lr=0.5, decoupled_min_lr=0.5))
    assert flat(0) == flat(50) == flat(100) == 0.5
    with pytest.raises(ValueError, match="--decoupled-min-lr=0.6 is above --decoupled-lr=0.5"):
        decoupled_lr_schedule(base, SimpleNamespace(decoupled_lr=0.5, decoupled_min_lr=0.6))
