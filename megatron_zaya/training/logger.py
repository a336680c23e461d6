"""Console lines, a progress bar for short local runs, and TensorBoard scalars (rank 0 only).

Megatron-LM also logs its main curves against the consumed samples ('lm loss vs samples', ...), so
that runs with different batch sizes line up. Those go to the run's `vs_samples` subfolder (a second
TensorBoard run beside the first): a resumed run drops the points an earlier attempt wrote past its
checkpoint, by iteration in the run's folder and by samples in the subfolder, and one folder cannot
do both.
"""
from __future__ import annotations

import glob
import json
import os
import sys

from megatron_zaya.checkpoint.format import atomic_write_json
from megatron_zaya.units import timestamp

# In the TensorBoard folder: the evaluations written at a run's last iteration ({"validation": N, "test": N}), so
# that a finished run started again (a job chain resubmitting until done) writes only what no job wrote there.
LAST_EVALUATIONS_FILE = "last_evaluations.json"

# Set to 1 by a launcher whose terminal gets the ranks' output through a pipe (examples/quickstart_cpu.sh's tee):
# --progress-bar is then drawn though stderr is not a terminal.
PROGRESS_BAR_BEHIND_PIPE = "MEGATRON_ZAYA_PROGRESS_BAR_BEHIND_PIPE"

# Megatron-LM's tags that it also writes as "TAG vs samples" (and every validation / test loss tag)
VS_SAMPLES_TAGS = ("lm loss", "learning-rate", "decoupled-learning-rate", "batch-size", "grad-norm", "params-norm",
                   "num-zeros", "world-size")


def has_vs_samples(tag: str) -> bool:
    return tag in VS_SAMPLES_TAGS or tag.startswith(("lm loss validation", "lm loss test"))


class TrainingLogger:
    def __init__(self, is_main: bool, tensorboard_dir: str | None, total_iters: int, start_iter: int,
                 progress_bar: bool = False, queue_size: int = 1000, start_samples: int = 0,
                 total_samples: int | None = None, purge: bool = True):
        """`progress_bar`: a tqdm bar on stderr when it is a terminal, or PROGRESS_BAR_BEHIND_PIPE says the
        pipe it is leads to one (else the console lines alone);
        `total_samples` (with --rampup-batch-size): the bar counts samples, whose pace gives an
        ETA when iterations grow; `purge` False for a job that trains nothing (--skip-train, a finished
        run), which must not drop the points an earlier job wrote past its iteration (the evaluations at the
        last iteration: `evaluation_scalars`)."""
        self.is_main = is_main
        self.writer = self.samples_writer = None
        self.bar = None
        self.total_iters, self.last_evaluations = total_iters, None
        if not is_main:
            return
        if tensorboard_dir:
            earlier = glob.glob(os.path.join(glob.escape(tensorboard_dir), "events.out.tfevents.*"))
            if purge and start_iter == 0 and earlier:
                self.print(f"WARNING: --tensorboard-dir {tensorboard_dir} holds an earlier run's event files; this run "
                           f"starts at iteration 0, so TensorBoard shows its points in their place (the files stay; "
                           f"another --tensorboard-dir keeps both in view)")
            self.last_evaluations = os.path.join(tensorboard_dir, LAST_EVALUATIONS_FILE)
            recorded = self._last_evaluations()
            kept = {kind: step for kind, step in recorded.items() if step <= start_iter}
            if purge and kept != recorded:      # the points past start_iter go (below): so do their records
                self._record_last_evaluations(kept)
            from torch.utils.tensorboard import SummaryWriter
            # purge_step: a run resumed from iteration N drops the points past N that an earlier
            # attempt wrote into the same folder, so every step has one point.
            self.writer = SummaryWriter(log_dir=tensorboard_dir, max_queue=queue_size, flush_secs=10,
                                        purge_step=start_iter + 1 if purge else None)
            self.samples_writer = SummaryWriter(log_dir=os.path.join(tensorboard_dir, "vs_samples"),
                                                max_queue=queue_size, flush_secs=10,
                                                purge_step=start_samples + 1 if purge else None)
        self.bar_counts_samples = total_samples is not None
        # (redrawn with carriage returns: not into a log file, unless asked for behind a pipe to a terminal)
        if progress_bar and (sys.stderr.isatty() or os.environ.get(PROGRESS_BAR_BEHIND_PIPE) == "1"):
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
        line = f"{timestamp()} {message}"
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

    def evaluation_scalars(self, kind: str, values: dict[str, float], step: int, samples: int) -> None:
        """An evaluation's scalars (`kind`: "validation" or "test"); at the run's last iteration once across
        jobs: the job that trained to it may have evaluated there, or have stopped before (an exit flag or a
        signal at the last iteration), and a job started again after it evaluates again."""
        if self.writer is None:
            return
        if step != self.total_iters:
            self.scalars(values, step, samples)
            return
        done = self._last_evaluations()
        if done.get(kind) == step:
            return
        self.scalars(values, step, samples)
        self.writer.flush()
        self.samples_writer.flush()
        self._record_last_evaluations({**done, kind: step})

    def _last_evaluations(self) -> dict[str, int]:
        try:
            with open(self.last_evaluations) as f:
                return {str(k): int(v) for k, v in json.load(f).items()}
        except (OSError, ValueError, AttributeError, TypeError):      # none yet, or unreadable: none written
            return {}

    def _record_last_evaluations(self, done: dict[str, int]) -> None:
        os.makedirs(os.path.dirname(self.last_evaluations), exist_ok=True)
        atomic_write_json(self.last_evaluations, done)

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
