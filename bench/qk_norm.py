"""CCA's QK-norm forward+backward for one layer's q and k: autograd through the composed torch ops against
reference.qk_norm (its backward written out), bf16 by default.

    python bench/qk_norm.py                                   # zaya1-tiny's and zaya1-100m's layer shapes
    python bench/qk_norm.py --shape 1,4096,8,2,128 --dtype fp32   # B,S,H,HKV,dh

Medians of --iters alternating calls after a warm-up, freed memory kept in the process as training on
CPU keeps it (training/cpu_allocator.py).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from megatron_zaya.kernels import reference  # noqa: E402
from megatron_zaya.training.cpu_allocator import keep_freed_memory  # noqa: E402

SHAPES = ("8,256,4,2,32", "4,512,8,2,64")   # zaya1-tiny 8 x 256, zaya1-100m 4 x 512


def composed(x, temperature):
    factor = math.sqrt(x.shape[-1]) / x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).eps)
    return x * (factor if temperature is None else factor * temperature.to(x.dtype)[:, None])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", nargs="+", default=list(SHAPES), help="B,S,H,HKV,dh")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: every CPU)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    keep_freed_memory()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}")
    print(f"{'shape B,S,H,HKV,dh':<22}{'composed ms':>13}{'qk_norm ms':>12}")
    for spec in args.shape:
        batch, seq, heads, kv_heads, head_dim = (int(v) for v in spec.split(","))
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(batch, seq, heads, head_dim, generator=gen).to(dtype).requires_grad_()
        k = torch.randn(batch, seq, kv_heads, head_dim, generator=gen).to(dtype).requires_grad_()
        temperature = torch.ones(kv_heads, requires_grad=True)
        grads = (torch.randn(q.shape, generator=gen).to(dtype), torch.randn(k.shape, generator=gen).to(dtype))
        times = {composed: [], reference.qk_norm: []}
        for i in range(args.iters + 3):
            for impl, record in times.items():
                start = time.perf_counter()
                torch.autograd.backward((impl(q, None), impl(k, temperature)), grads)
                if i >= 3:
                    record.append(time.perf_counter() - start)
        composed_ms, written_ms = (statistics.median(t) * 1e3 for t in times.values())
        print(f"{spec:<22}{composed_ms:>13.2f}{written_ms:>12.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
