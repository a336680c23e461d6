"""LR schedules: the decay-length flags, WSD's cosine decay, the end of an all-warmup run, and the
decoupled schedule's defaults and bounds (values by hand from Megatron-LM's OptimizerParamScheduler)."""
import math
from types import SimpleNamespace

import pytest

from megatron_zaya.optim.schedules import LRSchedule, decoupled_lr_schedule, lr_schedule_from_flags


def _flags(**kw):
    base = dict(train_iters=None, train_samples=None, min_lr=0.0, lr_decay_style="linear", lr_wsd_decay_style="linear",
                lr_warmup_iters=0, lr_decay_iters=None, lr_wsd_decay_iters=0, lr_warmup_samples=0,
                lr_decay_samples=None, lr_wsd_decay_samples=0, lr_warmup_fraction=None, lr_warmup_init=0.0,
                global_batch_size=1)
    return SimpleNamespace(**{**base, **kw})


def test_lr_decay_iters_and_samples_set_the_decay_length_not_the_run_length():
    by_iters = lr_schedule_from_flags(1.0, _flags(train_iters=100, lr_decay_iters=40, lr_warmup_iters=10), 100)
    assert by_iters.decay == 40
    assert by_iters(25) == pytest.approx(0.5) and by_iters(40) == 0.0 and by_iters(99) == 0.0   # min-lr after it
    by_samples = lr_schedule_from_flags(1.0, _flags(train_samples=1000, lr_decay_samples=400), 62)
    assert by_samples.decay == 400 and by_samples(200) == pytest.approx(0.5) and by_samples(500) == 0.0
    # --lr-warmup-fraction is a fraction of the decay length, not of the run
    assert lr_schedule_from_flags(1.0, _flags(train_iters=100, lr_decay_iters=40, lr_warmup_fraction=0.25),
                                  100).warmup == 10


def test_wsd_cosine_decay():
    s = LRSchedule(lr=1.0, min_lr=0.2, warmup=0, decay=100, decay_style="WSD", wsd_decay=20, wsd_decay_style="cosine")
    assert s(79) == 1.0 and s(80) == pytest.approx(1.0)
    assert s(85) == pytest.approx(0.2 + 0.8 * 0.5 * (math.cos(math.pi / 4) + 1))      # 0.883
    assert s(90) == pytest.approx(0.6) and s(100) == 0.2


def test_an_all_warmup_run_is_at_min_lr_once_the_decay_ends():
    """warmup == decay (--lr-warmup-fraction 1): the warmup's steps rise to the peak, and from the decay's end
    on the LR is --min-lr (Megatron-LM: num_steps > decay_steps -> min_lr; here the step that starts there)."""
    s = LRSchedule(lr=1.0, min_lr=0.1, warmup=10, decay=10, decay_style="cosine")
    assert s(9) == 1.0 and s(10) == 0.1 and s(50) == 0.1


def test_the_warmup_may_start_at_the_peak():
    s = LRSchedule(lr=1.0, warmup=10, decay=100, decay_style="linear", warmup_init=1.0)
    assert s(0) == 1.0 and s(5) == 1.0
    half = LRSchedule(lr=1.0, warmup=10, decay=100, decay_style="linear", warmup_init=0.5)
    assert half(0) == pytest.approx(0.55) and half(4) == pytest.approx(0.75)    # init + (lr - init) * (n + 1) / W
    assert lr_schedule_from_flags(1.0, _flags(train_iters=100, lr_warmup_iters=10, lr_warmup_init=0.5),
                                  100)(0) == pytest.approx(0.55)


def test_the_decoupled_schedule_floors_at_min_lr_by_default_and_may_warm_up_from_its_peak():
    base = LRSchedule(lr=1.0, min_lr=0.1, warmup=10, decay=110, decay_style="linear", warmup_init=0.5)
    decoupled = decoupled_lr_schedule(base, SimpleNamespace(decoupled_lr=0.5))
    assert (decoupled.lr, decoupled.min_lr, decoupled.warmup, decoupled.decay) == (0.5, 0.1, 10, 110)
    assert decoupled(0) == 0.5 and decoupled(60) == pytest.approx(0.3) and decoupled(110) == 0.1
    with pytest.raises(ValueError, match="--lr-warmup-init=0.5 is above --decoupled-lr=0.4"):
        decoupled_lr_schedule(base, SimpleNamespace(decoupled_lr=0.4))
    with pytest.raises(ValueError, match=r"--min-lr=0.1 is above --decoupled-lr=0.05 \(give --decoupled-min-lr\)"):
        decoupled_lr_schedule(LRSchedule(lr=1.0, min_lr=0.1, decay=100), SimpleNamespace(decoupled_lr=0.05))
