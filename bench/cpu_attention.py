"""Causal GQA attention on CPU in bf16: torch's flash kernel (SDPA) against megatron_zaya's blocked backward
(kernels/cpu_attention.py), forward and backward timed apart, with each one's gradient error against float64.

    python bench/cpu_attention.py                                   # zaya1-tiny's and zaya1-100m's shapes
    python bench/cpu_attention.py --shape 1,8,2,4096,128 --iters 3  # B,H,HKV,S,dh (zaya1-base, one sequence)
    python bench/cpu_attention.py --block-rows 128 256 512 1024     # the blocking of ours

q and k are scaled to norm sqrt(dh) per head, as CCA's QK-norm leaves them (key temperature 1). Times are
medians of --iters calls after a warm-up, with freed memory kept in the process as training on CPU keeps it
(training/cpu_allocator.py; else every large tensor is fresh pages); errors are
||grad - grad_float64|| / ||grad_float64|| for dq, dk, dv.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.timing import median_seconds  # noqa: E402
from megatron_zaya.kernels import cpu_attention  # noqa: E402
from megatron_zaya.training.cpu_allocator import keep_freed_memory  # noqa: E402

SHAPES = ("8,4,2,256,32", "4,8,2,512,64")   # zaya1-tiny 8 x 256, zaya1-100m 4 x 512


def make_inputs(batch, heads, kv_heads, seq, head_dim, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seq, head_dim, generator=gen)
    k = torch.randn(batch, kv_heads, seq, head_dim, generator=gen)
    v = torch.randn(batch, kv_heads, seq, head_dim, generator=gen)
    grad = torch.randn(batch, heads, seq, head_dim, generator=gen)
    q, k = (t * (head_dim ** 0.5 / t.norm(dim=-1, keepdim=True)) for t in (q, k))
    return q, k, v, grad


def flash(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def gradients(attention, inputs, grad, dtype):
    leaves = [t.detach().to(dtype).requires_grad_() for t in inputs]
    attention(*leaves).backward(grad.to(dtype))
    return [t.grad for t in leaves]


def relative_errors(attention, inputs, grad, exact):
    got = gradients(attention, inputs, grad, torch.bfloat16)
    return [((g.double() - e).norm() / e.norm()).item() for g, e in zip(got, exact)]


def forward_backward_times(attention, inputs, grad, iters: int):
    leaves = [t.bfloat16().requires_grad_() for t in inputs]
    grad = grad.bfloat16()
    state = {}

    def forward():
        state["out"] = attention(*leaves)

    def backward():
        forward()
        state["out"].backward(grad)

    t_forward = median_seconds(forward, iters, warmup=2)
    t_both = median_seconds(backward, iters, warmup=2)
    return t_forward, t_both - t_forward


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", nargs="+", default=list(SHAPES), help="B,H,HKV,S,dh")
    parser.add_argument("--block-rows", nargs="+", type=int, default=[cpu_attention.BLOCK_ROWS])
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: every CPU)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    kept = keep_freed_memory()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, malloc: "
          f"{'freed memory kept' if kept else 'glibc defaults'}, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
    print(f"{'shape B,H,HKV,S,dh':<22}{'kernel':<26}{'fwd ms':>9}{'bwd ms':>9}   error dq / dk / dv vs float64")
    for spec in args.shape:
        shape = tuple(int(x) for x in spec.split(","))
        q, k, v, grad = make_inputs(*shape)
        exact = gradients(flash, (q, k, v), grad, torch.float64)
        kernels = [("SDPA flash", flash)] + [(f"blocked backward ({rows} rows)", functools.partial(
            cpu_attention.causal_attention, block_rows=rows)) for rows in args.block_rows]
        for name, attention in kernels:
            t_fwd, t_bwd = forward_backward_times(attention, (q, k, v), grad, args.iters)
            errors = " / ".join(f"{e:.2e}" for e in relative_errors(attention, (q, k, v), grad, exact))
            print(f"{spec:<22}{name:<26}{t_fwd * 1e3:>9.2f}{t_bwd * 1e3:>9.2f}   {errors}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
