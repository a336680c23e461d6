"""Decode latency per token at several positions, with the CCA inference cache (CPU by default).

    python bench/decode_latency.py                                   # zaya1-tiny, positions 64 512 2048
    python bench/decode_latency.py --preset zaya1-100m --positions 64 512 2048 --steps 16 --threads 2

For each position P: prefill P random tokens into a fresh cache (in chunks), then time --steps
single-token decode steps (batch --batch-size) after --warmup untimed ones; report the median
milliseconds per step. With the cache, a step costs the same matmuls at every position plus an
attention read of P cached K/V rows (a small linear term); for contrast, the cache-free cost of one
new token (a full forward over P + 1 tokens) is also timed unless --no-baseline. Prints a Markdown
table (the "Decode latency" section of BENCHMARKS.md).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from megatron_zaya.config import PRESETS, model_config_from_preset  # noqa: E402
from megatron_zaya.inference import InferenceCache, forward_with_cache  # noqa: E402
from megatron_zaya.model import ZayaModel  # noqa: E402


def time_call(fn, repeats: int) -> tuple[list[float], list[float]]:
    """Wall-clock and process CPU seconds per call (CPU time is robust to a machine shared with
    other jobs when torch runs one thread)."""
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall, cpu


@torch.no_grad()
def bench_position(model, position: int, steps: int, warmup: int, batch: int, chunk: int, baseline: bool) -> dict:
    config = model.config
    gen = torch.Generator().manual_seed(position)
    cache = InferenceCache(config, batch, position + warmup + steps + 1, dtype=next(model.parameters()).dtype)
    prompt = torch.randint(0, config.vocab_size, (batch, position), generator=gen)
    for begin in range(0, position, chunk):
        forward_with_cache(model, cache, prompt[:, begin:begin + chunk])
    token = torch.randint(0, config.vocab_size, (batch, 1), generator=gen)
    for _ in range(warmup):
        forward_with_cache(model, cache, token)
    # Positions drift by warmup + steps (< 2% at P=2048 with the defaults): the step cost is what matters.
    wall, cpu = time_call(lambda: forward_with_cache(model, cache, token), steps)
    row = {"position": position, "decode_ms": 1e3 * statistics.median(wall), "decode_min_ms": 1e3 * min(wall),
           "decode_cpu_ms": 1e3 * statistics.median(cpu), "cache_tokens": int(cache.lengths[0])}
    if baseline:
        full = torch.randint(0, config.vocab_size, (batch, position + 1), generator=gen)
        model(full[:, :8])
        wall, cpu = time_call(lambda: model(full), 3)
        row["full_forward_ms"], row["full_forward_cpu_ms"] = 1e3 * statistics.median(wall), 1e3 * statistics.median(cpu)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="zaya1-tiny", help=f"one of {sorted(PRESETS)}")
    parser.add_argument("--positions", type=int, nargs="+", default=[64, 512, 2048])
    parser.add_argument("--steps", type=int, default=32, help="timed decode steps per position")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--prefill-chunk", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: stable on a shared machine)")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--no-baseline", action="store_true", help="skip the cache-free full-forward timing")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    config = model_config_from_preset(args.preset)
    need = max(args.positions) + args.warmup + args.steps + 1
    if need > config.max_position_embeddings:
        parser.error(f"--positions up to {max(args.positions)} need {need} > max_position_embeddings "
                     f"{config.max_position_embeddings} of --preset {args.preset}")
    model = ZayaModel(config).eval()
    if args.dtype == "bf16":
        model = model.to(torch.bfloat16)
    for p in model.parameters():
        p.requires_grad_(False)
    rows = [bench_position(model, p, args.steps, args.warmup, args.batch_size, args.prefill_chunk,
                           not args.no_baseline) for p in args.positions]
    print(f"preset {args.preset}, {args.dtype}, batch {args.batch_size}, {args.threads} thread(s), "
          f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"cache {InferenceCache(config, 1, 1, device='meta', dtype=next(model.parameters()).dtype).bytes_per_token()} "
          f"bytes/token")
    print()
    print("| position | decode wall ms/token (median) | wall min | decode CPU ms/token | "
          "cache-free wall ms/token (full forward) | cache-free CPU ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        base = (f"{r['full_forward_ms']:.1f} | {r['full_forward_cpu_ms']:.1f}" if "full_forward_ms" in r else "- | -")
        print(f"| {r['position']} | {r['decode_ms']:.2f} | {r['decode_min_ms']:.2f} | {r['decode_cpu_ms']:.2f} | {base} |")
    first, last = rows[0], rows[-1]
    print(f"\ndecode CPU time ratio position {last['position']} / {first['position']}: "
          f"{last['decode_cpu_ms'] / first['decode_cpu_ms']:.2f}x (wall {last['decode_ms'] / first['decode_ms']:.2f}x; "
          f"positions {last['position'] / first['position']:.0f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
