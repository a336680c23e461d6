"""Console lines, a progress bar for short local runs, and TensorBoard scalars (rank 0 only).

Megatron-LM also logs its main curves against the consumed samples ('lm loss vs samples', ...), so
that runs with different batch sizes line up. Those go to the run's `vs_samples` subfolder (a second
TensorBoard run beside the first): a resumed run drops the points an earlier attempt wrote past its
checkpoint, by iteration in the run's folder and by samples in the subfolder, and one folder cannot
do both.
"""
from __future__ import annotations

import os
import sys
import time

# Megatron-LM's tags that it also writes as "TAG vs samples" (and every validation / test loss tag)
VS_SAMPLES_TAGS = ("lm loss", "learning-rate", "decoupled-learning-rate", "batch-size", "grad-norm", "params-norm",
                   "num-zeros", "world-size")


def has_vs_samples(tag: str) -> bool:
    return tag in VS_SAMPLES_TAGS or tag.startswith(("lm loss validation", "lm loss test"))


class TrainingLogger:
    def __init__(self, is_main: bool, tensorboard_dir: str | None, total_iters: int, start_iter: int,
                 progress_bar: bool = False, queue_size: int = 1000, start_samples: int = 0,
                 total_samples: int | None = None, purge: bool = True):
        """`progress_bar`: a tqdm bar on stderr when it is a terminal (else the console lines alone);
        `total_samples` (with --rampup-batch-size): the bar counts samples, whose pace gives an
        ETA when iterations grow; `purge` False for a job that trains nothing (--skip-train, a finished
        run), which must not drop the points an earlier job wrote past its iteration."""
        self.is_main = is_main
        self.writer = self.samples_writer = None
        self.bar = None
        if not is_main:
            return
        if tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter
            # purge_step: a run resumed from iteration N drops the points past N that an earlier
            # attempt wrote into the same folder, so every step has one point.
            self.writer = SummaryWriter(log_dir=tensorboard_dir, max_queue=queue_size, flush_secs=10,
                                        purge_step=start_iter + 1 if purge else None)
            self.samples_writer = SummaryWriter(log_dir=os.path.join(tensorboard_dir, "vs_samples"),
                                                max_queue=queue_size, flush_secs=10,
                                                purge_step=start_samples + 1 if purge else None)
        self.bar_counts_samples = total_samples is not None
        if progress_bar and sys.stderr.isatty():     # (redrawn with carriage returns: not into a log file)
            from tqdm import tqdm
            total, initial, unit = ((total_samples, start_samples, "sample") if self.bar_counts_samples
                                    else (total_iters, start_iter, "it"))
            self.bar = tqdm(total=total, initial=initial, desc="train", unit=unit, dynamic_ncols=True,
                            file=sys.stderr)

    @property
    def writes_scalars(self) -> bool:
        return self.writer is not None

    def print(self, message: str) -> None:
        if self.is_main:
            self.print_any_rank(message)

    def print_any_rank(self, message: str) -> None:
        """A console line from whichever rank calls (e.g. the ranks that profile)."""
        line = f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {message}"
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, flush=True)

    def scalars(self, values: dict[str, float], step: int, samples: int | None = None) -> None:
        """`values` at iteration `step`; given the consumed `samples`, Megatron-LM's tags also as
        "TAG vs samples" at that many samples (in the vs_samples subfolder)."""
        if self.writer is None:
            return
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
            if samples is not None and has_vs_samples(tag):
                self.samples_writer.add_scalar(f"{tag} vs samples", value, samples)

    def advance(self, loss: float | None, samples: int) -> None:
        """One iteration of `samples` more on the progress bar (loss None: an iteration without a loss)."""
        if self.bar is not None:
            self.bar.update(samples if self.bar_counts_samples else 1)
            if loss is not None:
                self.bar.set_postfix(loss=f"{loss:.3f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        for writer in (self.writer, self.samples_writer):
            if writer is not None:
                writer.flush()
                writer.close()
