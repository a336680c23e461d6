"""--log-progress: Megatron-LM's progress.txt in the --save folder, one line per event, across jobs.

A run resubmitted after a failure or a time limit appends to the same file, so it reads as the
history of the whole training: when each job started, and at every checkpoint the iteration, the
job's and the cumulative model TFLOP/s per GPU, the model floating-point operations and the tokens
so far. Each line: "<time>\tJob ID: <SLURM_JOB_ID>\t# GPUs: <world size>\t<event>". The cumulative
figures come from the train state saved in the checkpoints (TrainState.floating_point_operations
and train_seconds), so they continue across jobs. Only the main rank writes.
"""
from __future__ import annotations

import os
import time

PROGRESS_FILE = "progress.txt"


class ProgressLog:
    def __init__(self, save_dir: str, world_size: int, is_main: bool):
        self.path = os.path.join(save_dir, PROGRESS_FILE)
        self.world_size, self.is_main = world_size, is_main
        self.job_start = (0.0, 0.0)      # (floating-point operations, train seconds) when this job began

    def write(self, event: str) -> None:
        if not self.is_main:
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        line = (f"{time.strftime('%Y-%m-%d %H:%M:%S')}\tJob ID: {os.environ.get('SLURM_JOB_ID', '')}\t"
                f"# GPUs: {self.world_size}\t{event}\n")
        with open(self.path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def job_started(self, state) -> None:
        self.job_start = (state.floating_point_operations, state.train_seconds)
        self.write("Starting job")

    def checkpoint_saved(self, state, event: str = "Saved checkpoint") -> None:
        flops, seconds = state.floating_point_operations, state.train_seconds
        job_flops, job_seconds = flops - self.job_start[0], seconds - self.job_start[1]
        self.write(f"{event}\tIteration: {state.iteration}\t"
                   f"Job throughput: {self._tflops(job_flops, job_seconds):.1f} TFLOP/s/GPU\t"
                   f"Cumulative throughput: {self._tflops(flops, seconds):.1f} TFLOP/s/GPU\t"
                   f"Floating-point operations: {flops:.2e}\t"
                   f"Tokens (in billions): {state.consumed_tokens / 1e9:.2f}")

    def _tflops(self, flops: float, seconds: float) -> float:
        return flops / max(seconds, 1e-9) / self.world_size / 1e12
