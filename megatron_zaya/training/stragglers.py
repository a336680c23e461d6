"""--log-straggler: which ranks are slow, every --log-interval iterations.

Each rank times its own forward+backward of every step: from after the step's first collective (the
token count, where every rank has arrived) to just before it waits for the gradient reduction, with
a device synchronize at both ends on a GPU. So a rank's time is its own work, not the wait for the
others that the step time includes on every rank alike. At each console line the interval's mean is
gathered from all ranks (one small all-gather) and the main rank prints the --straggler-minmax-count
slowest and fastest ranks and the slowest/fastest ratio; TensorBoard gets `straggler/max-seconds`,
`straggler/min-seconds` and `straggler/ratio`.

Under TP, EP and CP the ranks of one group wait for each other inside forward and backward (the
all-reduces, all-to-alls and K/V gathers), so their times move together: a slow GPU shows as its
group's ranks, compared with the other data-parallel groups.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from megatron_zaya.training.metrics import synchronize


@dataclass
class StragglerReport:
    seconds: list[float]        # per global rank: mean forward+backward seconds per iteration
    count: int                  # ranks named at each end

    @property
    def ranking(self) -> list[int]:
        return sorted(range(len(self.seconds)), key=lambda r: (self.seconds[r], r))

    @property
    def ratio(self) -> float:
        fastest = min(self.seconds)
        return max(self.seconds) / fastest if fastest > 0 else float("inf")

    def line(self) -> str:
        order = self.ranking
        slowest = ", ".join(f"{r} {self.seconds[r]:.3f} s" for r in reversed(order[-self.count:]))
        fastest = ", ".join(f"{r} {self.seconds[r]:.3f} s" for r in order[:self.count])
        plural = "s" if self.count > 1 else ""
        return (f"stragglers (forward+backward per iteration): slowest rank{plural} {slowest} | fastest "
                f"rank{plural} {fastest} | slowest/fastest {self.ratio:.2f}x")

    def scalars(self) -> dict[str, float]:
        return {"straggler/max-seconds": max(self.seconds), "straggler/min-seconds": min(self.seconds),
                "straggler/ratio": self.ratio}


class StragglerMeter:
    """This rank's forward+backward time over the current logging interval."""

    def __init__(self, device: torch.device, count: int):
        self.device, self.count = device, count
        self.seconds, self.steps = 0.0, 0
        self._started: float | None = None

    def start(self) -> None:
        synchronize(self.device)
        self._started = time.perf_counter()

    def stop(self) -> None:
        synchronize(self.device)
        self.seconds += time.perf_counter() - self._started
        self.steps += 1
        self._started = None

    def report(self, runtime) -> StragglerReport:
        """Every rank calls this at the same iteration (a collective); the interval starts again."""
        mine = self.seconds / max(self.steps, 1)
        self.seconds, self.steps = 0.0, 0
        return StragglerReport(runtime.gather_from_all_ranks(mine), self.count)
