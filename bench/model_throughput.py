"""Forward+backward tokens/s of our ZAYA model and of transformers' ZayaForCausalLM, same config and batch.

    python bench/model_throughput.py --preset zaya1-tiny --micro-batch-size 8 --seq-length 256
    python bench/model_throughput.py --preset zaya1-100m --micro-batch-size 4 --seq-length 512 --dtype bf16

Both models hold the same weights (ours exported to a Hugging Face folder and loaded by transformers).
Batches: `--batches fresh` (default) draws new random tokens for every iteration, the same for both
models, as training does: the routing, hence the experts' row counts, changes from step to step (on
CPU, bf16 matmuls compile a oneDNN kernel per new shape, which a model must cope with);
`--batches repeated` feeds one batch again and again (every shape seen in the warm-up).
Timing: `--warmup` untimed iterations of each, then `--iters` timed iterations of each, INTERLEAVED
(ours, reference, ours, ...) so that a change of machine load hits both alike; the medians are reported, and
the median of the iterations' ratios (each reference call over the call of ours before it), which a
machine whose speed drifts within a run moves less.
The load average is printed before and after: on a shared machine, only trust runs with a low one.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from megatron_zaya.checkpoint.hf_format import save_hf_folder  # noqa: E402
from megatron_zaya.config import model_config_from_preset  # noqa: E402
from megatron_zaya.kernels.capability import slow_bf16_warning  # noqa: E402
from megatron_zaya.model import ZayaModel  # noqa: E402


def time_interleaved(steps, warmup: int, iters: int) -> list[list[float]]:
    """Seconds of each timed call of each step function, their timed calls alternating."""
    for _ in range(warmup):
        for step in steps:
            step()
    times = [[] for _ in steps]
    for _ in range(iters):
        for step, record in zip(steps, times):
            start = time.perf_counter()
            step()
            record.append(time.perf_counter() - start)
    return times


class BatchStream:
    """Random (tokens, labels) batches; with fresh=True the i-th call of each model gets the i-th batch
    (the same for both), otherwise always the first."""

    def __init__(self, vocab_size: int, shape, fresh: bool):
        self.vocab_size, self.shape, self.fresh = vocab_size, shape, fresh
        self.batches: list = []
        self.calls: dict[str, int] = {}

    def next(self, who: str):
        index = self.calls.get(who, 0) if self.fresh else 0
        self.calls[who] = index + 1
        while len(self.batches) <= index:
            gen = torch.Generator().manual_seed(len(self.batches))
            self.batches.append((torch.randint(0, self.vocab_size, self.shape, generator=gen),
                                 torch.randint(0, self.vocab_size, self.shape, generator=gen)))
        return self.batches[index]


def load_average() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="zaya1-tiny")
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--seq-length", type=int, default=256)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: every CPU)")
    parser.add_argument("--batches", choices=["fresh", "repeated"], default="fresh",
                        help="new random tokens each iteration (as in training) or one batch repeated")
    parser.add_argument("--compile", action="store_true",
                        help="our reference (CPU) kernels through torch.compile (kernels.set_reference_compile)")
    parser.add_argument("--glibc-malloc-defaults", action="store_true",
                        help="leave glibc's malloc settings (default: keep freed memory in the process for both "
                             "models, as CPU training runs do: megatron_zaya/training/cpu_allocator.py)")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="after timing, profile 2 forward+backward steps of OUR model into DIR/ops.txt "
                             "(torch.profiler, self CPU time by op, and by op and input shape)")
    args = parser.parse_args(argv)
    from megatron_zaya import kernels
    from megatron_zaya.training.cpu_allocator import keep_freed_memory
    kept = False if args.glibc_malloc_defaults else keep_freed_memory()
    kernels.set_reference_compile(args.compile)
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    warning = slow_bf16_warning("cpu", "--dtype bf16") if args.dtype == "bf16" and not torch.cuda.is_available() else None
    if warning:
        print(f"WARNING {warning}", flush=True)
    load_before = load_average()
    import transformers

    torch.manual_seed(0)
    config = model_config_from_preset(args.preset, seq_length=args.seq_length)
    ours = ZayaModel(config)
    with tempfile.TemporaryDirectory() as tmp:
        save_hf_folder(ours.state_dict(), config, os.path.join(tmp, "hf"))
        reference = transformers.ZayaForCausalLM.from_pretrained(os.path.join(tmp, "hf"), attn_implementation="sdpa")
    reference.train()
    shape = (args.micro_batch_size, args.seq_length)
    batches = BatchStream(config.vocab_size, shape, fresh=args.batches == "fresh")
    autocast = torch.autocast("cpu" if not torch.cuda.is_available() else "cuda", dtype=torch.bfloat16,
                              enabled=args.dtype == "bf16")

    def ours_step():
        tokens, labels = batches.next("ours")
        with autocast:
            loss = ours(tokens, labels=labels).token_losses.mean()
        loss.backward()

    def reference_step():
        tokens, labels = batches.next("reference")
        with autocast:
            logits = reference(tokens).logits
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        loss.backward()

    n_tokens = args.micro_batch_size * args.seq_length
    ours.train()
    ours_times, ref_times = time_interleaved([ours_step, reference_step], args.warmup, args.iters)
    t_ours, t_ref = statistics.median(ours_times), statistics.median(ref_times)
    # Each reference call over the call of ours just before it: the two saw about the same machine.
    paired = statistics.median(r / o for o, r in zip(ours_times, ref_times))
    print(f"config {args.preset}: batch {args.micro_batch_size}x{args.seq_length} ({args.batches}), {args.dtype}, "
          f"threads {torch.get_num_threads()}{' | ours: compiled reference ops' if args.compile else ''} | "
          f"malloc: {'freed memory kept' if kept else 'glibc defaults'} | {time.strftime('%Y-%m-%d %H:%M %Z')} | "
          f"load before {load_before} after {load_average()}")
    print(f"{'model':<28}{'s/iter':>10}{'tokens/s':>12}")
    print(f"{'megatron-zaya':<28}{t_ours:>10.3f}{n_tokens / t_ours:>12.0f}")
    print(f"{'transformers ZayaForCausalLM':<28}{t_ref:>10.3f}{n_tokens / t_ref:>12.0f}")
    print(f"speed-up: {t_ref / t_ours:.2f}x (median of the {args.iters} paired iterations' ratios: {paired:.2f}x)")
    if args.profile:
        profile_ours(ours_step, args.profile)
    return 0


def profile_ours(step, path: str, steps: int = 2) -> None:
    from torch.profiler import ProfilerActivity, profile

    os.makedirs(path, exist_ok=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(steps):
            step()
    with open(os.path.join(path, "ops.txt"), "w") as f:
        f.write(f"{steps} forward+backward steps of megatron-zaya, load {load_average()}\n\n")
        f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=50))
        f.write("\n\nby input shape:\n")
        f.write(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=50))
    print(f"profile of {steps} steps of ours written to {path}/ops.txt")


if __name__ == "__main__":
    sys.exit(main())
