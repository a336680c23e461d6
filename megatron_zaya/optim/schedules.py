"""Learning-rate schedules with Megatron's names: linear warmup, then constant, linear, cosine or
WSD (warmup-stable-decay) down to --min-lr at --lr-decay-iters, and min-lr after it."""
from __future__ import annotations

import math
from dataclasses import dataclass

DECAY_STYLES = ("constant", "linear", "cosine", "WSD")
WSD_DECAY_STYLES = ("linear", "cosine", "exponential", "minus_sqrt")


@dataclass
class LRSchedule:
    lr: float
    min_lr: float = 0.0
    warmup_iters: int = 0
    decay_iters: int = 0                # --lr-decay-iters (default: --train-iters)
    decay_style: str = "cosine"
    wsd_decay_iters: int = 0            # WSD: length of the final decay
    wsd_decay_style: str = "linear"

    def __post_init__(self):
        if self.decay_style not in DECAY_STYLES:
            raise ValueError(f"--lr-decay-style={self.decay_style}: choose one of {DECAY_STYLES}")
        if self.wsd_decay_style not in WSD_DECAY_STYLES:
            raise ValueError(f"--lr-wsd-decay-style={self.wsd_decay_style}: choose one of {WSD_DECAY_STYLES}")
        if self.min_lr > self.lr:
            raise ValueError(f"--min-lr={self.min_lr} is above --lr={self.lr}")
        if self.decay_style != "constant" and self.decay_iters < self.warmup_iters:
            raise ValueError(f"--lr-decay-iters={self.decay_iters} is shorter than --lr-warmup-iters={self.warmup_iters}")
        if self.decay_style == "WSD" and not 0 < self.wsd_decay_iters <= self.decay_iters - self.warmup_iters:
            raise ValueError(f"--lr-wsd-decay-iters={self.wsd_decay_iters} must be in (0, decay iters - warmup]")

    def __call__(self, iteration: int) -> float:
        """Learning rate for the step that runs at `iteration` (0-based count of finished steps)."""
        if self.warmup_iters and iteration < self.warmup_iters:
            return self.lr * (iteration + 1) / self.warmup_iters
        if self.decay_style == "constant":
            return self.lr
        if iteration >= self.decay_iters:
            return self.min_lr
        span = self.lr - self.min_lr
        if self.decay_style == "WSD":
            decay_start = self.decay_iters - self.wsd_decay_iters
            if iteration < decay_start:
                return self.lr
            ratio = (iteration - decay_start) / self.wsd_decay_iters
            return self.min_lr + span * _wsd_coefficient(ratio, self.wsd_decay_style)
        ratio = (iteration - self.warmup_iters) / max(1, self.decay_iters - self.warmup_iters)
        if self.decay_style == "linear":
            coefficient = 1.0 - ratio
        else:
            coefficient = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + span * coefficient


def _wsd_coefficient(ratio: float, style: str) -> float:
    if style == "linear":
        return 1.0 - ratio
    if style == "cosine":
        return 0.5 * (math.cos(math.pi * ratio) + 1.0)
    if style == "exponential":
        return 2.0 * 0.5 ** ratio - 1.0             # Megatron-LM's: 1 at the start, 0 at the end
    return 1.0 - math.sqrt(ratio)                  # minus_sqrt
