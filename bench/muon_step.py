"""Time Muon's step (momentum, Newton-Schulz, update) on every Muon matrix of a preset, on this machine.

    python bench/muon_step.py --preset zaya1-100m
    python bench/muon_step.py --preset zaya1-tiny --iters 9
    python bench/muon_step.py --preset zaya1-tiny --ns-dtype bf16   # force a Newton-Schulz dtype
    python bench/muon_step.py --preset zaya1-100m --cpu-chunk-bytes 0 6291456   # whole stacks vs 6 MiB chunks

The matrices are the ones `optim.builder` gives Muon (attention and router linears, the stacked
expert weights), with random gradients. Prints the median seconds of a step, the Newton-Schulz
FLOPs (planner.time.newton_schulz_flops per matrix: 5 steps of 4 m^2 n + 2 m^3, m <= n) and their
rate, and the time of each shape group. Newton-Schulz runs in Muon's default dtype for this machine
(bf16 where bf16 matmuls are native, fp32 elsewhere: kernels/capability.py) unless --ns-dtype says.
--cpu-chunk-bytes V1 V2 ...: Muon.step with each value of reference.NEWTON_SCHULZ_CPU_CHUNK_BYTES (how
much of a stack Newton-Schulz takes per batched call on CPU; 0: the whole stack), the values alternating
step by step; the per-shape times then use the first value.
--baseline-tree PATH: also time the Muon of another checkout (e.g. `git worktree add /tmp/base REV`) on a
copy of the same matrices and gradients, its steps alternating with this tree's; prints both medians and
the median of the per-pair ratios (this machine's speed drifts too much for runs one after the other).

    git worktree add /tmp/base HEAD~1 && python bench/muon_step.py --preset zaya1-100m --baseline-tree /tmp/base
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.timing import median_seconds  # noqa: E402
from megatron_zaya.config import model_config_from_preset  # noqa: E402
from megatron_zaya.kernels import reference  # noqa: E402
from megatron_zaya.kernels.capability import newton_schulz_dtype  # noqa: E402
from megatron_zaya.model import ZayaModel  # noqa: E402
from megatron_zaya.optim.builder import split_parameters  # noqa: E402
from megatron_zaya.optim.muon import Muon  # noqa: E402
from megatron_zaya.planner.time import newton_schulz_flops  # noqa: E402
from megatron_zaya.training.cpu_allocator import keep_freed_memory  # noqa: E402


def matrix_flops(shape: torch.Size) -> float:
    """Newton-Schulz FLOPs of a (..., m, n) batch of matrices (planner.time.newton_schulz_flops each)."""
    return shape[:-2].numel() * newton_schulz_flops(shape[-2], shape[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="zaya1-100m")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: every CPU)")
    parser.add_argument("--ns-dtype", choices=["auto", "bf16", "fp32"], default="auto",
                        help="Newton-Schulz dtype (auto: Muon's default on this machine)")
    parser.add_argument("--cpu-chunk-bytes", type=int, nargs="+", default=None, metavar="BYTES",
                        help="values of reference.NEWTON_SCHULZ_CPU_CHUNK_BYTES to compare (0: whole stacks)")
    parser.add_argument("--baseline-tree", default=None, metavar="PATH",
                        help="another checkout of this repository whose Muon.step to time against this one's")
    args = parser.parse_args(argv)
    ns_dtype = {"auto": newton_schulz_dtype("cpu"), "bf16": torch.bfloat16, "fp32": torch.float32}[args.ns_dtype]
    keep_freed_memory()
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    torch.manual_seed(0)
    model = ZayaModel(model_config_from_preset(args.preset))
    matrices = [p for _, p in split_parameters(model, use_muon=True)[0]]
    for p in matrices:
        p.grad = torch.randn_like(p)
    if args.baseline_tree:
        return compare_with_baseline(args.baseline_tree, matrices, ns_dtype, args.iters)
    optimizer = Muon(matrices, lr=1e-4, ns_dtype=ns_dtype)
    flops = sum(matrix_flops(p.shape) for p in matrices)
    print(f"{args.preset}: {len(matrices)} Muon matrices, {sum(p.numel() for p in matrices) / 1e6:.1f}M parameters, "
          f"{torch.get_num_threads()} threads, Newton-Schulz in {str(ns_dtype).removeprefix('torch.')}, "
          f"median of {args.iters}")
    chunk_values = args.cpu_chunk_bytes or [reference.NEWTON_SCHULZ_CPU_CHUNK_BYTES]
    default = reference.NEWTON_SCHULZ_CPU_CHUNK_BYTES
    try:
        time_steps_and_shapes(optimizer, matrices, chunk_values, flops, ns_dtype, args.iters)
    finally:
        reference.NEWTON_SCHULZ_CPU_CHUNK_BYTES = default
    return 0


def baseline_muon_class(tree: str):
    """The Muon class of another checkout, imported under the same module names and then set aside
    (its functions keep their own modules), so both trees' optimizers live in one process."""
    root = os.path.abspath(tree)
    if not os.path.isfile(os.path.join(root, "megatron_zaya", "optim", "muon.py")):
        raise SystemExit(f"--baseline-tree {tree}: no megatron_zaya/optim/muon.py there")

    def ours() -> dict:
        return {k: m for k, m in sys.modules.items() if k == "megatron_zaya" or k.startswith("megatron_zaya.")}

    saved = ours()
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, root)
    try:
        import megatron_zaya.optim.muon as baseline
    finally:
        sys.path.remove(root)
        for name in ours():
            del sys.modules[name]
        sys.modules.update(saved)
    if not os.path.abspath(baseline.__file__).startswith(root + os.sep):
        raise SystemExit(f"--baseline-tree {tree}: imported {baseline.__file__} instead")
    return baseline.Muon


@torch.no_grad()
def compare_with_baseline(tree: str, matrices: list, ns_dtype, iters: int) -> int:
    """This tree's Muon.step against the baseline tree's, on copies of the same matrices and gradients,
    steps alternating (the first pair untimed)."""
    optimizers = []
    for cls in (baseline_muon_class(tree), Muon):
        params = [torch.nn.Parameter(p.detach().clone()) for p in matrices]
        for param, p in zip(params, matrices):
            param.grad = p.grad
        optimizers.append((cls(params, lr=1e-4, ns_dtype=ns_dtype), params))
    times: list[list[float]] = [[], []]
    for i in range(iters + 1):
        for (optimizer, _), record in zip(optimizers, times):
            start = time.perf_counter()
            optimizer.step()
            if i:
                record.append(time.perf_counter() - start)
    ratios = [b / t for b, t in zip(*times)]
    drift = max(float((a - b).abs().max()) for a, b in zip(optimizers[0][1], optimizers[1][1]))
    print(f"Muon.step baseline ({tree}) {statistics.median(times[0]):.3f} s | this tree "
          f"{statistics.median(times[1]):.3f} s | per-pair speed-up median {statistics.median(ratios):.3f}x "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}) | largest parameter difference after "
          f"{iters + 1} steps {drift:.2e}")
    return 0


def time_steps_and_shapes(optimizer, matrices, chunk_values: list[int], flops: float, ns_dtype, iters: int) -> None:
    """Muon.step under each chunk value (interleaved), then each shape group's Newton-Schulz under the first."""
    for chunk_bytes, step in zip(chunk_values, interleaved_steps(optimizer.step, chunk_values, iters)):
        chunks = f"CPU chunks of {chunk_bytes / 2 ** 20:g} MiB" if chunk_bytes else "whole stacks"
        print(f"Muon.step {step:.3f} s | Newton-Schulz {flops / 1e9:.0f} GFLOP, {flops / step / 1e12:.3f} TFLOP/s "
              f"over the whole step | {chunks}")
    reference.NEWTON_SCHULZ_CPU_CHUNK_BYTES = chunk_values[0]
    by_shape: dict[tuple, list[torch.Tensor]] = {}
    for p in matrices:
        by_shape.setdefault(tuple(p.shape), []).append(p.grad)
    for shape, grads in by_shape.items():
        stacked = torch.stack(grads)
        seconds = median_seconds(lambda: reference.newton_schulz(stacked, dtype=ns_dtype), iters)
        print(f"  newton_schulz {len(grads):3d} x {str(shape):18s} {1e3 * seconds:8.1f} ms "
              f"{matrix_flops(stacked.shape) / seconds / 1e12:.3f} TFLOP/s")


def interleaved_steps(step, chunk_values: list[int], iters: int) -> list[float]:
    """Median seconds of `step` under each NEWTON_SCHULZ_CPU_CHUNK_BYTES value, the values alternating."""
    times: list[list[float]] = [[] for _ in chunk_values]
    for i in range(iters + 1):
        for value, record in zip(chunk_values, times):
            reference.NEWTON_SCHULZ_CPU_CHUNK_BYTES = value
            start = time.perf_counter()
            step()
            if i:
                record.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


if __name__ == "__main__":
    sys.exit(main())
