"""Learning-rate schedules with Megatron's names: linear warmup, then constant, linear, cosine, WSD
(warmup-stable-decay) down to --min-lr at the end of the decay, or inverse-square-root (lr * sqrt(warmup /
position), floored at --min-lr), and min-lr after the decay.

The schedule's position counts what successful steps have consumed (a skipped step does not move
it), as Megatron-LM's OptimizerParamScheduler does: in samples under --train-samples (the
--lr-*-samples flags); in global batches under --train-iters (the --lr-*-iters flags), each step
counting its batch over the --global-batch-size of its time, so a --rampup-batch-size step moves the
schedule by less than one iteration, and a resume with another --global-batch-size (ZAYA1's 32K
phase) continues it at the run's iteration.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
WSD_DECAY_STYLES = ("linear", "cosine", "exponential", "minus_sqrt")
ITERATION_FLAGS = ("lr_warmup_iters", "lr_decay_iters", "lr_wsd_decay_iters")
SAMPLE_FLAGS = ("lr_warmup_samples", "lr_decay_samples", "lr_wsd_decay_samples")


@dataclass
class LRSchedule:
    lr: float
    min_lr: float = 0.0
    warmup: float = 0                   # --lr-warmup-iters / -samples
    decay: float = 0                    # --lr-decay-iters / -samples (default: the whole run)
    decay_style: str = "cosine"
    wsd_decay: float = 0                # WSD: length of the final decay
    wsd_decay_style: str = "exponential"     # Megatron-LM's default
    unit: str = "iters"                 # what positions count: "iters" or "samples" (named in errors)
    warmup_init: float = 0.0            # --lr-warmup-init: the lr the warmup starts from
    # inverse-square-root's floor on the warmup and the position: one sample, as Megatron-LM counts them
    # (1 / --global-batch-size in iterations: without a warmup the lr is lr / sqrt(samples consumed)).
    one_sample: float = 1.0

    def __post_init__(self):
        u = self.unit
        if self.decay_style not in DECAY_STYLES:
            raise ValueError(f"--lr-decay-style={self.decay_style}: choose one of {DECAY_STYLES}")
        if self.wsd_decay_style not in WSD_DECAY_STYLES:
            raise ValueError(f"--lr-wsd-decay-style={self.wsd_decay_style}: choose one of {WSD_DECAY_STYLES}")
        if not 0 <= self.warmup_init <= self.lr:
            raise ValueError(f"--lr-warmup-init={self.warmup_init} must be in [0, --lr={self.lr}]")
        if self.min_lr > self.lr:
            raise ValueError(f"--min-lr={self.min_lr} is above --lr={self.lr}")
        if self.decay_style != "constant" and self.decay < self.warmup:
            raise ValueError(f"--lr-decay-{u}={self.decay:g} is shorter than the warmup ({self.warmup:g} {u})")
        if self.decay_style == "WSD" and not 0 < self.wsd_decay <= self.decay - self.warmup:
            raise ValueError(f"--lr-wsd-decay-{u}={self.wsd_decay:g} must be in (0, decay {u} - warmup]")

    def __call__(self, position: float, step: float = 1) -> float:
        """Learning rate for the step that starts at `position` (iterations or samples consumed by the
        steps before it) and moves it by `step`."""
        if self.warmup and position < self.warmup:
            rise = (self.lr - self.warmup_init) * (position + step) / self.warmup
            return min(self.lr, self.warmup_init + rise)
        if self.decay_style == "constant":
            return self.lr
        if self.decay_style == "inverse-square-root":      # Megatron-LM's, min-lr only past the decay's end
            if position > self.decay:
                return self.min_lr
            floor = self.one_sample
            return max(self.min_lr, self.lr * math.sqrt(max(self.warmup, floor) / max(position, floor)))
        if position >= self.decay:
            return self.min_lr
        span = self.lr - self.min_lr
        if self.decay_style == "WSD":
            decay_start = self.decay - self.wsd_decay
            if position < decay_start:
                return self.lr
            ratio = (position - decay_start) / self.wsd_decay
            return self.min_lr + span * _wsd_coefficient(ratio, self.wsd_decay_style)
        ratio = (position - self.warmup) / max(1, self.decay - self.warmup)
        if self.decay_style == "linear":
            coefficient = 1.0 - ratio
        else:
            coefficient = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + span * coefficient


# The flags that define the LR and weight-decay schedules (what --use-checkpoint-opt_param-scheduler
# takes from the checkpoint): train_iters / train_samples only as the length the decay defaults to.
SCHEDULE_FLAGS = ("lr", "min_lr", "lr_decay_style", "lr_warmup_iters", "lr_decay_iters", "lr_wsd_decay_iters",
                  "lr_warmup_samples", "lr_decay_samples", "lr_wsd_decay_samples", "lr_wsd_decay_style",
                  "lr_warmup_fraction", "lr_warmup_init", "train_iters", "train_samples", "weight_decay",
                  "weight_decay_incr_style", "start_weight_decay", "end_weight_decay", "decoupled_lr",
                  "decoupled_min_lr")


def schedule_flags_of(meta: dict) -> dict:
    """The schedule flags a checkpoint's run trained with: its "schedule_flags" (a training save's, or those a
    reshard kept with its source's train state), else those of its "args" (a checkpoint saved before they were
    kept); none for another conversion, whose "args" record a tokenizer only."""
    if "schedule_flags" in meta:
        return meta["schedule_flags"]
    if meta.get("converted_from"):
        return {}
    return {name: value for name, value in meta.get("args", {}).items() if name in SCHEDULE_FLAGS}


def flag_value_text(value) -> str:
    """A schedule flag's value in a message: "not given" for a flag left out (None)."""
    return "not given" if value is None else str(value)


def counts_samples(flags) -> bool:
    """Whether the schedules count samples (a --train-samples run) rather than global batches."""
    return flags.train_samples is not None and not flags.train_iters


def lr_schedule_from_flags(lr: float, flags, total_iters: int) -> LRSchedule:
    """The run's schedule from Megatron's flags (`flags`: the parsed arguments or a TrainConfig).
    Iteration flags go with --train-iters and sample flags with --train-samples, as in Megatron-LM;
    --lr-warmup-fraction is a fraction of the decay in either."""
    samples = counts_samples(flags)
    wrong, unit = (ITERATION_FLAGS, "samples") if samples else (SAMPLE_FLAGS, "iters")
    for name in wrong:
        if getattr(flags, name):
            run = "--train-samples" if samples else "--train-iters"
            raise ValueError(f"--{name.replace('_', '-')} does not go with {run}: give the "
                             f"--lr-*-{unit} flags instead (as in Megatron-LM)")
    if samples:
        warmup, decay, wsd = flags.lr_warmup_samples, flags.lr_decay_samples or flags.train_samples, \
            flags.lr_wsd_decay_samples
    else:
        warmup, decay, wsd = flags.lr_warmup_iters, flags.lr_decay_iters or total_iters, flags.lr_wsd_decay_iters
    if flags.lr_warmup_fraction is not None:
        if warmup:
            raise ValueError(f"--lr-warmup-fraction and --lr-warmup-{unit} exclude each other")
        if not 0 <= flags.lr_warmup_fraction <= 1:
            raise ValueError(f"--lr-warmup-fraction={flags.lr_warmup_fraction} must be in [0, 1]")
        warmup = flags.lr_warmup_fraction * decay
    elif flags.lr_decay_style != "constant" and decay < warmup:
        # (named by the flags that set them: the decay is the run's length unless --lr-decay-* is given)
        given = flags.lr_decay_samples if samples else flags.lr_decay_iters
        length = f"--lr-decay-{unit}={decay:g}" if given else \
            f"--train-{unit}={decay:g} (the decay's length without --lr-decay-{unit})"
        config = getattr(flags, "config", None)
        raise ValueError(f"{length} is shorter than the warmup, --lr-warmup-{unit}={warmup:g}"
                         + (f" (from --config {config} unless given)" if config else "")
                         + ": lower the warmup too, or lengthen the decay")
    return LRSchedule(lr, flags.min_lr, warmup, decay, flags.lr_decay_style, wsd, flags.lr_wsd_decay_style, unit,
                      getattr(flags, "lr_warmup_init", 0.0), 1.0 if samples else 1.0 / flags.global_batch_size)


def decoupled_lr_schedule(schedule: LRSchedule, flags) -> LRSchedule | None:
    """Megatron-LM's --decoupled-lr / --decoupled-min-lr: the embedding's and output layer's own peak
    and floor on the run's schedule (same warmup, decay and unit). None without --decoupled-lr."""
    decoupled = getattr(flags, "decoupled_lr", None)
    if decoupled is None:
        return None
    floor = getattr(flags, "decoupled_min_lr", None)
    floor_flag = "--min-lr" if floor is None else "--decoupled-min-lr"
    floor = schedule.min_lr if floor is None else floor
    if floor > decoupled:
        raise ValueError(f"{floor_flag}={floor} is above --decoupled-lr={decoupled}"
                         + (" (give --decoupled-min-lr)" if floor_flag == "--min-lr" else ""))
    if schedule.warmup_init > decoupled:
        raise ValueError(f"--lr-warmup-init={schedule.warmup_init} is above --decoupled-lr={decoupled} (the "
                         f"decoupled schedule warms up from it too)")
    return dataclasses.replace(schedule, lr=decoupled, min_lr=floor)


def _wsd_coefficient(ratio: float, style: str) -> float:
    if style == "linear":
        return 1.0 - ratio
    if style == "cosine":
        return 0.5 * (math.cos(math.pi * ratio) + 1.0)
    if style == "exponential":
        return 2.0 * 0.5 ** ratio - 1.0             # Megatron-LM's: 1 at the start, 0 at the end
    return 1.0 - math.sqrt(ratio)                  # minus_sqrt


WD_INCR_STYLES = ("constant", "linear", "cosine")


@dataclass
class WeightDecaySchedule:
    """Megatron-LM's --weight-decay-incr-style: weight decay moves from --start-weight-decay to
    --end-weight-decay over the whole run (`total`, in the LR schedule's unit), linearly or along a
    half cosine; positions as LRSchedule's."""
    start: float
    end: float
    total: float
    style: str = "linear"

    def __call__(self, position: float) -> float:
        if position >= self.total:
            return self.end
        ratio = position / self.total
        coefficient = ratio if self.style == "linear" else 0.5 * (math.cos(math.pi * (1 - ratio)) + 1.0)
        return self.start + coefficient * (self.end - self.start)


def weight_decay_schedule_from_flags(flags, total_iters: int) -> WeightDecaySchedule | None:
    """None for --weight-decay-incr-style constant (--weight-decay throughout)."""
    style, start, end = flags.weight_decay_incr_style, flags.start_weight_decay, flags.end_weight_decay
    if style not in WD_INCR_STYLES:
        raise ValueError(f"--weight-decay-incr-style={style}: choose one of {WD_INCR_STYLES}")
    if style == "constant":
        for flag, value in (("--start-weight-decay", start), ("--end-weight-decay", end)):
            if value is not None:
                raise ValueError(f"{flag} needs --weight-decay-incr-style linear or cosine "
                                 f"(constant uses --weight-decay)")
        return None
    for flag, value in (("--start-weight-decay", start), ("--end-weight-decay", end)):
        if value is None or value < 0:
            raise ValueError(f"--weight-decay-incr-style {style} needs {flag} >= 0")
    return WeightDecaySchedule(start, end, flags.train_samples if counts_samples(flags) else total_iters, style)
