"""LR schedules at their boundaries."""
import math

import pytest

from megatron_zaya.optim.schedules import LRSchedule


def test_warmup_then_cosine():
    s = LRSchedule(lr=1.0, min_lr=0.1, warmup_iters=10, decay_iters=110, decay_style="cosine")
    assert s(0) == pytest.approx(0.1)           # first step: lr / warmup
    assert s(9) == pytest.approx(1.0)           # last warmup step reaches the peak
    assert s(10) == pytest.approx(1.0)          # decay starts at the peak
    assert s(60) == pytest.approx(0.1 + 0.9 * 0.5)   # half way: cos(pi/2)
    assert s(110) == pytest.approx(0.1) and s(500) == pytest.approx(0.1)


def test_linear_and_constant():
    lin = LRSchedule(lr=2.0, min_lr=0.0, warmup_iters=0, decay_iters=100, decay_style="linear")
    assert lin(0) == 2.0 and lin(50) == pytest.approx(1.0) and lin(100) == 0.0
    const = LRSchedule(lr=2.0, warmup_iters=5, decay_style="constant")
    assert const(4) == 2.0 and const(10_000) == 2.0


def test_wsd_stable_then_decay():
    s = LRSchedule(lr=1.0, min_lr=0.0, warmup_iters=10, decay_iters=100, decay_style="WSD", wsd_decay_iters=20)
    assert s(10) == 1.0 and s(79) == 1.0        # stable phase
    assert s(80) == 1.0                         # decay starts
    assert s(90) == pytest.approx(0.5)          # linear decay half way
    assert s(100) == 0.0
    cosine = LRSchedule(lr=1.0, warmup_iters=0, decay_iters=100, decay_style="WSD", wsd_decay_iters=20,
                        wsd_decay_style="minus_sqrt")
    assert cosine(85) == pytest.approx(1 - math.sqrt(0.25))
    exponential = LRSchedule(lr=1.0, warmup_iters=0, decay_iters=100, decay_style="WSD", wsd_decay_iters=20,
                             wsd_decay_style="exponential")
    # Megatron-LM's coefficient 2 * 0.5**r - 1 of the decay ratio r: 0.4142 half way (sqrt(2) - 1)
    assert exponential(80) == 1.0 and exponential(90) == pytest.approx(math.sqrt(2) - 1) and exponential(100) == 0.0


@pytest.mark.parametrize("kwargs, flag", [
    (dict(decay_style="bogus"), "--lr-decay-style"),
    (dict(min_lr=2.0), "--min-lr"),
    (dict(decay_style="WSD", decay_iters=100, wsd_decay_iters=0), "--lr-wsd-decay-iters"),
])
def test_bad_schedules_name_the_flag(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        LRSchedule(lr=1.0, **kwargs)
