"""Start-up time a run spends on its data: `pretrain_zaya.py --dry-run` (every check and index a run makes
before its first step, no model) on one synthetic dataset of many sequences, started twice in fresh
processes: the first start with an empty --data-cache-path, the second as a restart finds it.

    python bench/data_startup.py --sequences 100000000            # a 2 GB .idx, as one data-parallel rank

Documents are 1-3 tokens long (ids below 1000, uint16), so the .idx (20 bytes per sequence) dominates, as
in a corpus of trillions of tokens. The dataset is written once under --dir and kept for later runs; the
cache folder is emptied before the first start.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from megatron_zaya.data.indexed import IndexedDatasetWriter  # noqa: E402


def write_dataset(prefix: str, sequences: int, chunk: int = 1 << 22) -> None:
    rng = np.random.default_rng(0)
    with IndexedDatasetWriter(prefix, dtype=np.uint16) as builder:
        for start in range(0, sequences, chunk):
            lengths = rng.integers(1, 4, min(chunk, sequences - start)).astype(np.int32)
            tokens = rng.integers(0, 1000, int(lengths.sum())).astype(np.uint16)
            builder.add_documents(tokens, lengths)


def dry_run_seconds(prefix: str, cache: str) -> float:
    cmd = [sys.executable, os.path.join(ROOT, "pretrain_zaya.py"), "--dry-run", "--preset", "zaya1-tiny",
           "--data-path", prefix, "--data-cache-path", cache, "--tokenizer-type", "NullTokenizer",
           "--tokenizer-model", "1000", "--seq-length", "64", "--micro-batch-size", "1", "--global-batch-size", "1",
           "--train-iters", "10", "--eval-iters", "0", "--split", "100,0,0"]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sequences", type=int, default=100_000_000)
    p.add_argument("--dir", default="/tmp/megatron_zaya_data_startup")
    args = p.parse_args(argv)
    prefix = os.path.join(args.dir, f"synthetic_{args.sequences}_text_document")
    if not os.path.exists(prefix + ".idx"):
        os.makedirs(args.dir, exist_ok=True)
        started = time.perf_counter()
        write_dataset(prefix, args.sequences)
        print(f"wrote {prefix} ({os.path.getsize(prefix + '.idx') / 2**30:.2f} GiB .idx) in "
              f"{time.perf_counter() - started:.0f} s")
    cache = os.path.join(args.dir, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    first = dry_run_seconds(prefix, cache)
    second = dry_run_seconds(prefix, cache)
    print(f"{args.sequences:,} sequences: first start {first:.1f} s (empty cache), restart {second:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
