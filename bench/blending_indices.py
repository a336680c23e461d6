"""Time of the blend's greedy interleave (index_builders.build_blending_indices): compiled C against Python.

    python bench/blending_indices.py --samples 1000000 --datasets 2 3 20 100
    python bench/blending_indices.py --samples 100000000 --datasets 20 --skip-python

For each blend size (equal weights perturbed, seeded), times the compiled loop (native_blending.py; its
compilation is done before timing) and the Python loop on --samples samples, checks that both give the
same indices, and extrapolates to ZAYA1's run: 834,465 steps x 4,096 sequences = 3.42B samples, which the
rank building the data cache spends on this loop before the first step. Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from megatron_zaya.data.index_builders import build_blending_indices  # noqa: E402
from megatron_zaya.data.native_blending import native_blending  # noqa: E402

ZAYA1_SAMPLES = 834_465 * 4096


def timed(weights, samples, native):
    start = time.perf_counter()
    built = build_blending_indices(weights, samples, native=native)
    return time.perf_counter() - start, built


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=1_000_000)
    p.add_argument("--datasets", type=int, nargs="+", default=[2, 3, 20, 100])
    p.add_argument("--skip-python", action="store_true", help="time the compiled loop only")
    args = p.parse_args(argv)
    if native_blending() is None:
        print("no working C compiler: only the Python loop exists here")
        return 1
    print(f"{args.samples:,} samples; extrapolated to ZAYA1's {ZAYA1_SAMPLES:,}\n")
    print("| datasets | compiled s | Python s | speed-up | ZAYA1 run, compiled | ZAYA1 run, Python |")
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for n in args.datasets:
        weights = (np.ones(n) + 0.1 * rng.random(n)).tolist()
        weights = [w / sum(weights) for w in weights]
        compiled, built = timed(weights, args.samples, True)
        scale = ZAYA1_SAMPLES / args.samples
        if args.skip_python:
            print(f"| {n} | {compiled:.3f} | - | - | {compiled * scale / 60:.1f} min | - |")
            continue
        python, reference = timed(weights, args.samples, False)
        assert all(np.array_equal(a, b) for a, b in zip(built, reference)), "compiled and Python indices differ"
        print(f"| {n} | {compiled:.3f} | {python:.2f} | {python / compiled:.0f}x | {compiled * scale / 60:.1f} min "
              f"| {python * scale / 60:.0f} min |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
