"""Time and peak memory of a GPT dataset's sample index (index_builders.build_sample_index), its document
index walked in chunks of DOCUMENT_INDEX_CHUNK entries or in one pass (--whole: the int64 lengths and
cumulative ends of the whole index at once, as before the chunking).

    python bench/sample_index.py --documents 2000000 --seq-length 16            # 128M samples
    python bench/sample_index.py --documents 2000000 --seq-length 16 --whole

Document lengths are drawn uniformly from 50..1999 tokens (seeded), one epoch in order. The peak resident
memory of this process (ru_maxrss) is printed with the time; run each variant in its own process.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import megatron_zaya.data.index_builders as ib  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--documents", type=int, default=2_000_000)
    p.add_argument("--seq-length", type=int, default=16)
    p.add_argument("--whole", action="store_true", help="one pass over the whole document index (the old way)")
    args = p.parse_args(argv)
    if args.whole:
        ib.DOCUMENT_INDEX_CHUNK = 1 << 62
    sizes = np.random.default_rng(0).integers(50, 2000, args.documents).astype(np.int32)
    document_index = np.arange(args.documents, dtype=np.int32)
    start = time.perf_counter()
    out = ib.build_sample_index(sizes, document_index, args.seq_length, 1, int(sizes.sum(dtype=np.int64)))
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"{'whole' if args.whole else 'chunked'}: {out.shape[0] - 1:,} samples in {seconds:.2f} s, peak RSS "
          f"{peak:.2f} GiB (the index itself {out.nbytes / 2**30:.2f} GiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
