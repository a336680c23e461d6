"""Time the LM head's three matmuls (forward, dX, dW) in two memory layouts, on CPU or GPU.

    python bench/lm_head_layouts.py                           # zaya1-100m's head: 2048 x 512 x 32768, bf16
    python bench/lm_head_layouts.py --tokens 2048 --hidden 256 --vocab 32768 --dtype fp32

rows:   logits (N, V) = h @ W^T, the layout of F.linear; the CE gradient g is (N, V);
        backward dX = g @ W, dW = g^T @ h (g^T a transposed view), or dW^T = h^T @ g (h^T a view).
cols:   logits^T (V, N) = W @ h^T; the CE runs down the columns and writes g^T (V, N);
        backward dW = g^T @ h (both operands contiguous), dX = (g^T)^T @ W.
Each matmul is timed alone (median of --iters, after 2 warm-up calls); the CE itself is not timed.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.timing import median_seconds  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args(argv)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.manual_seed(0)
    n, d, v = args.tokens, args.hidden, args.vocab
    h = torch.randn(n, d, dtype=dtype)
    w = torch.randn(v, d, dtype=dtype) * d ** -0.5
    g = torch.randn(n, v, dtype=dtype)
    g_t = g.t().contiguous()
    print(f"N={n} D={d} V={v} {args.dtype}, {torch.get_num_threads()} threads, median of {args.iters}")
    rows = {
        "rows fwd  h @ W^T": lambda: F.linear(h, w),
        "rows dX   g @ W": lambda: g @ w,
        "rows dW   g^T @ h": lambda: g.t() @ h,
        "rows dW^T h^T @ g": lambda: h.t() @ g,
        "cols fwd  W @ h^T": lambda: w @ h.t(),
        "cols dW   g^T @ h (contig)": lambda: g_t @ h,
        "cols dX   (g^T)^T @ W": lambda: g_t.t() @ w,
        "cols dX^T W^T @ g^T": lambda: w.t() @ g_t,
    }
    for name, fn in rows.items():
        print(f"{name:30s} {1e3 * median_seconds(fn, args.iters, warmup=2):8.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
