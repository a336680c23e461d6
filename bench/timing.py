"""Wall-clock timing shared by the micro-benchmarks: the median of repeated calls after a warm-up."""
from __future__ import annotations

import statistics
import time


def median_seconds(fn, iters: int, warmup: int = 1, synchronize=None) -> float:
    """Median wall seconds of `iters` calls of fn(), after `warmup` untimed calls. `synchronize`
    (e.g. torch.cuda.synchronize) is called before and after each timed call, so that queued
    device work is inside the interval."""
    sync = synchronize or (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
