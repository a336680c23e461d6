"""The time split of a training step for bench/train_throughput.py: a clock that attributes wall time to
the step's phases (data, forward, backward, communication, optimizer, balancing, other), the hooks that
switch it at the boundaries of Trainer.train_step's parts, and wrappers that count the time inside
torch.distributed's collectives as communication whatever the phase."""
from __future__ import annotations

import time
from collections import defaultdict

import torch.distributed as dist

PHASES = ("data", "forward", "backward", "communication", "optimizer", "balancing", "other")


class PhaseClock:
    """Attributes wall time to the current phase; time spent inside collectives goes to
    "communication" whatever the phase (collective wrappers add to `self.comm`)."""

    def __init__(self, sync=None):
        self.totals: dict[str, float] = defaultdict(float)
        self.phase = None
        self.start = 0.0
        self.comm = 0.0
        self.comm_mark = 0.0
        self.sync = sync or (lambda: None)

    def switch(self, phase: str | None) -> None:
        self.sync()
        now = time.perf_counter()
        if self.phase is not None:
            comm = self.comm - self.comm_mark
            self.totals[self.phase] += (now - self.start) - comm
            self.totals["communication"] += comm
        self.phase, self.start, self.comm_mark = phase, now, self.comm

    def reset(self) -> None:
        self.totals.clear()


class _TimedWork:
    """An async collective's handle whose wait() counts as communication."""

    def __init__(self, work, clock):
        self._work, self._clock = work, clock

    def wait(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            self._clock.comm += time.perf_counter() - start

    def __getattr__(self, name):
        return getattr(self._work, name)


COLLECTIVES = ("all_reduce", "reduce_scatter_single", "all_gather_single", "reduce_scatter_tensor", "all_gather_into_tensor",
               "all_gather", "all_to_all_single",
               "broadcast", "batch_isend_irecv", "barrier", "reduce_scatter", "all_to_all")


def time_collectives(clock: PhaseClock) -> None:
    """Wrap torch.distributed's collectives (looked up as dist.<name> at call time by the parallel code)."""
    for name in COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is None or getattr(fn, "_timed", False):
            continue

        def timed(*args, _fn=fn, **kwargs):
            start = time.perf_counter()
            try:
                result = _fn(*args, **kwargs)
            finally:
                clock.comm += time.perf_counter() - start
            if isinstance(result, list):
                return [_TimedWork(w, clock) if w is not None else w for w in result]
            return _TimedWork(result, clock) if result is not None else result

        timed._timed = True
        setattr(dist, name, timed)


def instrument(trainer, clock: PhaseClock) -> None:
    """Phase switches at the boundaries of train_step's parts, without changing what it does."""
    model, runtime = trainer.model, trainer.parallel
    model.register_forward_pre_hook(lambda *a: clock.switch("forward"))
    model.register_forward_hook(lambda *a: clock.switch("backward"))

    def wrap(obj, name, phase, after=None):
        original = getattr(obj, name)

        def wrapped(*args, **kwargs):
            clock.switch(phase)
            try:
                return original(*args, **kwargs)
            finally:
                if after:
                    clock.switch(after)

        setattr(obj, name, wrapped)

    wrap(runtime, "finish_gradient_reduction", "other")
    wrap(runtime, "clip_grad_norm", "optimizer", after="other")
    wrap(trainer.optimizer, "step", "optimizer", after="other")
    wrap(trainer.balancer, "update", "balancing", after="other")
