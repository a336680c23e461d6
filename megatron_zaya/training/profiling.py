"""--profile: a window of training iterations profiled, with Megatron-LM's flags and meaning.

The steps run while the count of completed iterations is in [--profile-step-start, --profile-step-end)
are profiled (the defaults 10 and 12 profile iterations 11 and 12), on the ranks in --profile-ranks.
A run resumed inside the window profiles the rest of it; one cut short writes what it has.

Each profiled step is a named range, "iteration N", in the trace.
- With --use-pytorch-profiler, torch.profiler records the CPU ops (and the GPU kernels where there is
  a GPU). At the window's end each profiled rank writes, into --tensorboard-dir,
  `rank<R>_iterations<A>-<B>.pt.trace.json` (TensorBoard's profiler plugin, chrome://tracing,
  Perfetto) and `rank<R>_iterations<A>-<B>.ops.txt`, the ops by self time (and by input shape with
  --pytorch-profiler-collect-shapes), readable with no viewer at all.
- Without it (GPU only), the CUDA profiler API is started and stopped around the window, with an
  NVTX range per op, for `nsys profile --capture-range=cudaProfilerApi`. On ROCm those calls do nothing
  (PyTorch's ROCm build stubs them): rocprof records the whole run, with the roctx ranges marking the
  window, as a warning says.
- --record-memory-history (GPU only): the caching allocator records every allocation from the first
  iteration on; the profiled ranks dump a snapshot to --memory-snapshot-path (rank-suffixed when
  several ranks record) at the window's end, or at the end of training when no window ran
  (view it at https://pytorch.org/memory_viz).

Files are written under a temporary name and renamed, so none is ever left half-written.
"""
from __future__ import annotations

import os

import torch

from megatron_zaya.errors import UserInputError

MEMORY_HISTORY_ENTRIES = 100_000


def check_profile_flags(args, world_size: int, has_gpu: bool) -> list[str]:
    """Flag checks before anything is built; returns warnings. Raises UserInputError naming the flag."""
    warnings = []
    if args.record_memory_history and not has_gpu:
        raise UserInputError("--record-memory-history records the GPU caching allocator's history and needs a "
                             "GPU; on CPU, profile with --profile --use-pytorch-profiler")
    if not args.profile:
        if args.use_pytorch_profiler:
            warnings.append("--use-pytorch-profiler without --profile: nothing is profiled")
        return warnings
    if args.profile_step_start < 0:
        raise UserInputError(f"--profile-step-start={args.profile_step_start}: must be >= 0")
    if args.profile_step_end <= args.profile_step_start:
        raise UserInputError(f"--profile-step-end={args.profile_step_end} must be greater than "
                             f"--profile-step-start={args.profile_step_start}")
    bad = [r for r in args.profile_ranks if not 0 <= r < world_size]
    if bad:
        raise UserInputError(f"--profile-ranks {bad[0]}: not a rank of this run (ranks 0..{world_size - 1})")
    if args.use_pytorch_profiler:
        if not args.tensorboard_dir:
            raise UserInputError("--use-pytorch-profiler writes its traces into --tensorboard-dir: give one")
    elif not has_gpu:
        raise UserInputError("--profile without --use-pytorch-profiler drives nsys / rocprof through the CUDA "
                             "profiler API and needs a GPU; add --use-pytorch-profiler (works on CPU)")
    return warnings


def _replace_atomically(write, path: str) -> None:
    """write(temporary path), then rename it to `path`."""
    temporary = f"{path}.tmp{os.getpid()}"
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


class StepProfiler:
    """Starts and stops the profilers at iteration boundaries (Trainer calls before_step, after_step,
    close). Inert on ranks outside --profile-ranks and when neither --profile nor
    --record-memory-history is given."""

    def __init__(self, cfg, rank: int, world_size: int, print_fn=print):
        self.cfg, self.rank, self.print = cfg, rank, print_fn
        on_rank = rank in (cfg.profile_ranks or [0])
        self.window = (cfg.profile_step_start, cfg.profile_step_end) if cfg.profile and on_rank else None
        self.memory_history = bool(cfg.record_memory_history) and on_rank
        self.several_ranks = len(cfg.profile_ranks or [0]) > 1 and world_size > 1
        self.first = None            # completed iterations when the profiler started
        self.done = False
        self.snapshot_written = False
        self._torch_profiler = None
        self._nvtx = None
        self._step_range = None
        if self.memory_history:
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)

    @property
    def active(self) -> bool:
        return self.first is not None

    def before_step(self, completed: int) -> None:
        if not self.active:
            if self.window is None or self.done or not self.window[0] <= completed < self.window[1]:
                return
            self._start(completed)
        self._step_range = torch.profiler.record_function(f"iteration {completed + 1}")   # a named range per step
        self._step_range.__enter__()

    def after_step(self, completed: int) -> None:
        if self._step_range is not None:
            step_range, self._step_range = self._step_range, None
            step_range.__exit__(None, None, None)
        if self.active and completed >= self.window[1]:
            self._stop(completed)

    def _start(self, completed: int) -> None:
        self.first = completed
        if self.cfg.use_pytorch_profiler:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._torch_profiler = torch.profiler.profile(
                activities=activities, record_shapes=self.cfg.pytorch_profiler_collect_shapes,
                with_stack=self.cfg.pytorch_profiler_collect_callstack)
            self._torch_profiler.start()
        else:
            if torch.version.hip:      # PyTorch's ROCm build makes cudaProfilerStart/Stop return success, doing nothing
                self.print(f"WARNING: --profile on ROCm: the profiler API does not start or stop rocprof, which "
                           f"records the whole run; the window's ranges (iteration {completed + 1}, ...) mark it. "
                           f"--use-pytorch-profiler records the window alone")
            torch.cuda.profiler.start()
            self._nvtx = torch.autograd.profiler.emit_nvtx(record_shapes=self.cfg.pytorch_profiler_collect_shapes)
            self._nvtx.__enter__()

    def close(self, completed: int) -> None:
        """End of training (or an exception): stop a window cut short, dump the memory snapshot."""
        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
            self._step_range = None
        if self.active:
            self._stop(completed)
        if self.memory_history:
            if not self.snapshot_written:
                self._dump_memory_snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            self.memory_history = False

    def _stop(self, completed: int) -> None:
        first, self.first, self.done = self.first, None, True
        label = f"iterations {first + 1}-{completed}"
        if self._torch_profiler is not None:
            profiler, self._torch_profiler = self._torch_profiler, None
            profiler.stop()
            base = os.path.join(self.cfg.tensorboard_dir, f"rank{self.rank}_iterations{first + 1}-{completed}")
            os.makedirs(self.cfg.tensorboard_dir, exist_ok=True)
            _replace_atomically(profiler.export_chrome_trace, base + ".pt.trace.json")
            _replace_atomically(lambda path: self._write_ops_table(profiler, label, path), base + ".ops.txt")
            self.print(f"profiled {label} on rank {self.rank} (torch.profiler): {base}.pt.trace.json, "
                       f"{base}.ops.txt")
        elif self._nvtx is not None:
            nvtx, self._nvtx = self._nvtx, None
            nvtx.__exit__(None, None, None)
            torch.cuda.profiler.stop()
            self.print(f"profiled {label} on rank {self.rank} (CUDA profiler API, for nsys / rocprof)")
        if self.memory_history:
            self._dump_memory_snapshot()

    def _write_ops_table(self, profiler, label: str, path: str) -> None:
        sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        with open(path, "w") as f:
            f.write(f"{label} on rank {self.rank}, ops by {sort}\n\n")
            f.write(profiler.key_averages().table(sort_by=sort, row_limit=60))
            if self.cfg.pytorch_profiler_collect_shapes:
                f.write("\n\nby input shape:\n")
                f.write(profiler.key_averages(group_by_input_shape=True).table(sort_by=sort, row_limit=60))

    def _dump_memory_snapshot(self) -> None:
        path = self.cfg.memory_snapshot_path
        if self.several_ranks:
            stem, ext = os.path.splitext(path)
            path = f"{stem}.rank{self.rank}{ext}"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        _replace_atomically(torch.cuda.memory._dump_snapshot, path)
        self.snapshot_written = True
        self.print(f"GPU memory snapshot of rank {self.rank}: {path} (https://pytorch.org/memory_viz)")
