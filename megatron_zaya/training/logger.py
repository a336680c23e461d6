"""Console lines, a progress bar for short local runs, and TensorBoard scalars (rank 0 only)."""
from __future__ import annotations

import sys
import time


class TrainingLogger:
    def __init__(self, is_main: bool, tensorboard_dir: str | None, total_iters: int, start_iter: int,
                 progress_bar: bool = False, queue_size: int = 1000):
        self.is_main = is_main
        self.writer = None
        self.bar = None
        if not is_main:
            return
        if tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter
            # purge_step: a run resumed from iteration N drops the points past N that an earlier
            # attempt wrote into the same folder, so every step has one point.
            self.writer = SummaryWriter(log_dir=tensorboard_dir, max_queue=queue_size, flush_secs=10,
                                        purge_step=start_iter + 1)
        if progress_bar:
            from tqdm import tqdm
            self.bar = tqdm(total=total_iters, initial=start_iter, desc="train", unit="it", dynamic_ncols=True,
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

    def scalars(self, values: dict[str, float], step: int) -> None:
        if self.writer is None:
            return
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def advance(self, loss: float | None) -> None:
        """One iteration more on the progress bar (loss None: an iteration without a loss)."""
        if self.bar is not None:
            self.bar.update(1)
            if loss is not None:
                self.bar.set_postfix(loss=f"{loss:.3f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
