"""Global batch size over training: constant, or Megatron's --rampup-batch-size START INCREMENT SAMPLES."""
from __future__ import annotations


class BatchSizeSchedule:
    def __init__(self, global_batch_size: int, micro_batch_size: int, dp_size: int,
                 rampup: list[int] | None = None):
        self.global_batch_size = global_batch_size
        self.micro_times_dp = micro_batch_size * dp_size
        self.rampup = None
        if rampup:
            if len(rampup) != 3:
                raise ValueError(f"--rampup-batch-size takes START INCREMENT SAMPLES, got {rampup}")
            start, increment, samples = (int(v) for v in rampup)
            if start <= 0 or increment <= 0 or samples <= 0:
                raise ValueError(f"--rampup-batch-size values must be positive, got {rampup}")
            if start > global_batch_size:       # (Megatron-LM refuses it too; here every step ran at the global batch)
                raise ValueError(f"--rampup-batch-size: the start {start} is above --global-batch-size "
                                 f"{global_batch_size}: a ramp-up goes up to the global batch")
            if (global_batch_size - start) % increment:
                raise ValueError(f"--rampup-batch-size: global batch {global_batch_size} minus start {start} "
                                 f"is not a multiple of the increment {increment}")
            for size in range(start, global_batch_size + 1, increment):
                self._check(size, "--rampup-batch-size")
            steps = (global_batch_size - start) // increment
            self.rampup = (start, increment, samples / max(1, steps))
        self._check(global_batch_size, "--global-batch-size")

    def _check(self, size: int, flag: str) -> None:
        if size % self.micro_times_dp:
            raise ValueError(f"{flag}: batch size {size} is not divisible by --micro-batch-size x data-parallel "
                             f"size = {self.micro_times_dp}")

    def batch_size(self, consumed_samples: int) -> int:
        if self.rampup is None:
            return self.global_batch_size
        start, increment, samples_per_increment = self.rampup
        size = start + int(consumed_samples / samples_per_increment) * increment   # Megatron's rounding (// on the
        # float step was one increment behind where the quotient is a whole number, e.g. 50 / (100 / 6))
        return min(size, self.global_batch_size)

    def num_micro_batches(self, consumed_samples: int) -> int:
        return self.batch_size(consumed_samples) // self.micro_times_dp

    def samples_consumed(self, start_consumed: int, iterations: int) -> int:
        """Samples the next `iterations` steps consume, starting at `start_consumed`."""
        consumed, left = start_consumed, iterations
        while left > 0 and self.batch_size(consumed) < self.global_batch_size:     # the ramp-up's steps
            consumed += self.batch_size(consumed)
            left -= 1
        return consumed - start_consumed + max(0, left) * self.global_batch_size   # then full batches

    def iterations_for_samples(self, train_samples: int, start_consumed: int = 0) -> int:
        """--train-samples -> iterations from `start_consumed` samples on (a resumed run, whose batch size may
        differ from its checkpoint's): whole global batches only, a partial last batch is dropped.

        Megatron-LM's update_train_iters does the same: train_samples // global_batch_size without
        ramp-up; with it, the ramp-up steps then (train_samples - consumed) // global_batch_size.
        The one difference: Megatron counts every ramp-up step even when --train-samples ends inside
        the ramp-up; here the run never consumes more than --train-samples."""
        iterations, consumed = 0, start_consumed
        while self.batch_size(consumed) < self.global_batch_size:       # the ramp-up's steps, one by one
            if consumed + self.batch_size(consumed) > train_samples:
                return iterations
            consumed += self.batch_size(consumed)
            iterations += 1
        # then full batches, counted at once (a loop over them took seconds at millions of iterations)
        return iterations + max(0, train_samples - consumed) // self.global_batch_size


def run_length(cfg, dp_size: int, iteration: int = 0, consumed_samples: int = 0) -> tuple[BatchSizeSchedule, int]:
    """The batch-size schedule and the iteration a run ends at (TrainConfig `cfg`, `dp_size` replicas): --train-iters,
    or under --train-samples where the samples run out, counted from a resumed run's position (`iteration`,
    `consumed_samples`) at this run's batch sizes: a resume with another --global-batch-size stops at
    --train-samples too (counted from sample 0 at the new size, it overshot or stopped short)."""
    schedule = BatchSizeSchedule(cfg.global_batch_size, cfg.micro_batch_size, dp_size, cfg.rampup_batch_size)
    if cfg.train_iters:
        return schedule, cfg.train_iters
    return schedule, iteration + schedule.iterations_for_samples(cfg.train_samples, consumed_samples)
