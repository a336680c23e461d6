"""The MFU ceiling of a model's own matmuls: how far its forward+backward could go if nothing but them ran.

    python bench/matmul_ceiling.py --preset zaya1-100m --micro-batch-size 4 --seq-length 512 --threads 2
    python bench/matmul_ceiling.py --preset zaya1-tiny --micro-batch-size 8 --seq-length 256 --threads 2

One bf16-autocast forward+backward of our model runs under a dispatch mode that records every call of
the compute-bound operators (matmuls: mm, addmm, bmm, baddbmm, _grouped_mm; attention: torch's flash
kernels for CPU; convolutions) with copies of their operands (same shapes, strides, dtypes, and for
_grouped_mm the same expert offsets). Each distinct call is then replayed alone, its operands hot in
cache, and timed (the fastest of `--repeats`: a ceiling takes each call at its best), times the number of
calls it stood for.

Printed: the model FLOPs of the micro-batch (`accounting.training_flops_per_token`, what the trainer's
MFU counts), the real forward+backward time (the fastest of `--iters`, interleaved with the replay so a
drifting machine moves both alike), the replayed time of each operator class, and

    ceiling MFU = model FLOPs / (replayed time of every recorded call) / measured bf16 peak

the MFU the forward+backward would reach if every other operator (norms, casts, softmax, routing,
permutes) took no time and no optimizer step followed; and, per `--global-batch-size`, the same for a
whole training step: its micro-batches' calls plus the recorded calls of one Muon + AdamW step (Muon's
Newton-Schulz matmuls on every matrix: optimizer work, not model FLOPs, so it lowers the step's MFU).
A training MFU target above this ceiling cannot be met by this model on this machine; the peak is
`training.metrics.measure_matmul_tflops`'s (the best of square 1024 and 2048 matmuls), as in
bench/train_throughput.py, here the best of the passes.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from megatron_zaya.config import model_config_from_preset  # noqa: E402
from megatron_zaya.model import ZayaModel  # noqa: E402
from megatron_zaya.model.accounting import training_flops_per_token  # noqa: E402
from megatron_zaya.optim.builder import OptimizerConfig, build_optimizer  # noqa: E402
from megatron_zaya.training.metrics import measure_matmul_tflops  # noqa: E402

aten = torch.ops.aten
MATMULS = {aten.mm.default: "matmul", aten.addmm.default: "matmul", aten.bmm.default: "matmul",
           aten.baddbmm.default: "matmul", aten._grouped_mm.default: "matmul (grouped experts)"}
NAMED_CLASSES = {"_scaled_dot_product_flash_attention_for_cpu": "attention kernel",
                 "_scaled_dot_product_flash_attention_for_cpu_backward": "attention kernel",
                 "convolution": "convolution", "convolution_backward": "convolution"}


def op_class(func) -> str | None:
    return MATMULS.get(func) or NAMED_CLASSES.get(func.overloadpacket.__name__)


def matmul_flops(func, args) -> float:
    """2 x multiply-adds of one matmul call (0 for the other classes)."""
    if func in (aten.mm.default, aten.bmm.default):
        a, b = args[0], args[1]
    elif func in (aten.addmm.default, aten.baddbmm.default):
        a, b = args[1], args[2]
    elif func is aten._grouped_mm.default:
        a, b = args[0], args[1]
        return 2.0 * a.shape[0] * a.shape[-1] * b.shape[-1]   # every row of a meets one expert's matrix
    else:
        return 0.0
    return 2.0 * a.numel() * b.shape[-1]


def copy_operand(value):
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype).copy_(value)
    if isinstance(value, (list, tuple)):
        return type(value)(copy_operand(v) for v in value)
    return value


def signature(value):
    if isinstance(value, torch.Tensor):
        small_ints = value.dtype in (torch.int32, torch.int64) and value.numel() <= 1024
        return (tuple(value.shape), value.stride(), str(value.dtype), tuple(value.tolist()) if small_ints else None)
    if isinstance(value, (list, tuple)):
        return tuple(signature(v) for v in value)
    return repr(value)


class RecordComputeOps(TorchDispatchMode):
    """Records each distinct compute-bound call once, with copies of its operands, and how often it ran."""

    def __init__(self):
        super().__init__()
        self.calls: dict = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = op_class(func)
        if kind is not None:
            key = (func, signature(args), signature(tuple(sorted(kwargs.items()))))
            if key in self.calls:
                self.calls[key]["count"] += 1
            else:
                self.calls[key] = dict(func=func, kind=kind, args=copy_operand(args), kwargs=copy_operand(kwargs),
                                       count=1, flops=matmul_flops(func, args))
        return func(*args, **kwargs)


def replay_seconds(call: dict, repeats: int) -> float:
    func, args, kwargs = call["func"], call["args"], call["kwargs"]
    func(*args, **kwargs)                               # warm-up: oneDNN builds its kernel for the shape
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        func(*args, **kwargs)
        times.append(time.perf_counter() - start)
    return min(times)


def describe(call: dict) -> str:
    shapes = [tuple(a.shape) for a in call["args"] if isinstance(a, torch.Tensor)]
    return f"{call['func'].overloadpacket.__name__} {' x '.join(str(s) for s in shapes[:3])}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="zaya1-100m")
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--seq-length", type=int, default=512)
    parser.add_argument("--num-layers", type=int, default=None, help="default: the preset's")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: every CPU)")
    parser.add_argument("--iters", type=int, default=3, help="real forward+backward passes timed (and replays)")
    parser.add_argument("--repeats", type=int, default=5, help="timed replays of each distinct call per pass")
    parser.add_argument("--global-batch-size", type=int, nargs="*", default=[8, 32],
                        help="also the ceiling of whole training steps of these global batches: the micro-batches' "
                             "recorded calls plus those of one Muon + AdamW step (its Newton-Schulz matmuls)")
    parser.add_argument("--top", type=int, default=8, help="the distinct calls with the most replayed time printed")
    args = parser.parse_args(argv)
    from megatron_zaya.training.cpu_allocator import keep_freed_memory
    keep_freed_memory()
    torch.set_num_threads(args.threads or os.cpu_count() or 1)

    torch.manual_seed(0)
    layers = {} if args.num_layers is None else {"num_layers": args.num_layers}
    config = model_config_from_preset(args.preset, seq_length=args.seq_length, **layers)
    model = ZayaModel(config).train()
    gen = torch.Generator().manual_seed(0)
    shape = (args.micro_batch_size, args.seq_length)
    tokens, labels = (torch.randint(0, config.vocab_size, shape, generator=gen) for _ in range(2))

    def forward_backward(keep_gradients=False):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(tokens, labels=labels).token_losses.mean()
        loss.backward()
        if not keep_gradients:
            model.zero_grad(set_to_none=True)

    forward_backward()                                   # warm-up
    recorder = RecordComputeOps()
    with recorder:
        forward_backward()
    calls = list(recorder.calls.values())
    optimizer = build_optimizer(model, OptimizerConfig())
    forward_backward(keep_gradients=True)
    optimizer_recorder = RecordComputeOps()
    with optimizer_recorder:
        optimizer.step()
    optimizer_calls = list(optimizer_recorder.calls.values())
    model.zero_grad(set_to_none=True)

    peaks, real, replayed = [], [], defaultdict(list)
    for _ in range(args.iters):
        peaks.append(max(measure_matmul_tflops(torch.bfloat16, size, 10) for size in (1024, 2048)))
        start = time.perf_counter()
        forward_backward()
        real.append(time.perf_counter() - start)
        for index, call in enumerate(calls + optimizer_calls):
            replayed[index].append(replay_seconds(call, args.repeats) * call["count"])
    seconds = {index: min(times) for index, times in replayed.items()}
    optimizer_s = sum(seconds.pop(index) for index in range(len(calls), len(calls) + len(optimizer_calls)))
    peak, real_s = max(peaks), min(real)      # each at the machine's best, as the replays
    model_flops = training_flops_per_token(config, args.seq_length) * tokens.numel()

    by_class: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for index, call in enumerate(calls):
        entry = by_class[call["kind"]]
        entry[0] += seconds[index]
        entry[1] += call["flops"] * call["count"]
        entry[2] += call["count"]
    replay_total = sum(seconds.values())
    print(f"config {args.preset}: micro-batch {args.micro_batch_size}x{args.seq_length}, bf16 autocast, threads "
          f"{torch.get_num_threads()} | {time.strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"measured bf16 matmul peak {peak:.3f} TFLOP/s (per pass: {', '.join(f'{p:.2f}' for p in peaks)})")
    print(f"model FLOPs per micro-batch {model_flops / 1e12:.4f} TFLOP; real forward+backward {real_s:.3f} s "
          f"(MFU {100 * model_flops / real_s / (peak * 1e12):.1f}%)")
    print(f"{'operator class':<28}{'calls':>7}{'replayed s':>12}{'share of real':>15}{'TFLOP/s':>10}")
    for kind, (secs, flops, count) in sorted(by_class.items(), key=lambda item: -item[1][0]):
        rate = f"{flops / secs / 1e12:.3f}" if flops else "-"
        print(f"{kind:<28}{count:>7}{secs:>12.3f}{100 * secs / real_s:>14.1f}%{rate:>10}")
    print(f"{'all recorded':<28}{sum(c['count'] for c in calls):>7}{replay_total:>12.3f}"
          f"{100 * replay_total / real_s:>14.1f}%")
    print(f"ceiling MFU (only these calls, no optimizer): {100 * model_flops / replay_total / (peak * 1e12):.1f}% "
          f"of the measured bf16 peak")
    optimizer_flops = sum(call["flops"] * call["count"] for call in optimizer_calls)
    print(f"one optimizer step (Muon + AdamW): {sum(c['count'] for c in optimizer_calls)} recorded calls, "
          f"{optimizer_flops / 1e12:.4f} TFLOP (not model FLOPs), replayed {optimizer_s:.3f} s")
    for global_batch in args.global_batch_size:
        micro_batches = max(1, global_batch // args.micro_batch_size)
        ceiling = micro_batches * model_flops / (micro_batches * replay_total + optimizer_s) / (peak * 1e12)
        print(f"ceiling MFU of a training step at global batch {global_batch} ({micro_batches} micro-batches, "
              f"these calls and the optimizer's only): {100 * ceiling:.1f}%")
    print(f"the {args.top} distinct calls with the most replayed time:")
    for index in sorted(seconds, key=lambda i: -seconds[i])[:args.top]:
        call = calls[index]
        rate = f", {call['flops'] * call['count'] / seconds[index] / 1e12:.2f} TFLOP/s" if call["flops"] else ""
        print(f"  {seconds[index] * 1e3:8.1f} ms  x{call['count']:<3} {describe(call)}{rate}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
