"""Wall-clock timing shared by the CPU micro-benchmarks: the median of repeated calls after a warm-up."""
from __future__ import annotations

import statistics
import time


def median_seconds(fn, iters: int, warmup: int = 1) -> float:
    """Median wall seconds of `iters` calls of fn(), after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
