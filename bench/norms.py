"""One block's RMSNorms and residual merges, forward+backward: autograd through the composed torch ops of
their definitions against reference.rms_norm / reference.scaled_residual_add (backward written out).

    python bench/norms.py                                     # zaya1-tiny's and zaya1-100m's shapes (B,S,D)
    python bench/norms.py --model zaya1-100m --micro-batch-size 4 --seq-length 512 --iters 10

Ops: a block's input norm, its attention merge + pre-MLP norm and its MoE merge, the residual stream in
fp32, the sublayer outputs and the normed outputs in bf16 (as under bf16 autocast).
--model: whole forward+backward steps of that preset under bf16 autocast, the model's reference ops
switched between the composed ones and the written-out ones from step to step (fresh random batches);
prints both medians and the median of the paired steps' ratios.
Medians after a warm-up, freed memory kept in the process as training on CPU keeps it
(training/cpu_allocator.py).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from megatron_zaya.kernels import reference  # noqa: E402
from megatron_zaya.training.cpu_allocator import keep_freed_memory  # noqa: E402

SHAPES = ("8,256,128", "4,512,512")   # (B, S, D): zaya1-tiny 8 x 256 of 128, zaya1-100m 4 x 512 of 512
WRITTEN = (reference.rms_norm, reference.scaled_residual_add)


def composed_rms_norm(x, weight, eps):
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def composed_merge(out, residual, out_scale, out_bias, res_scale, res_bias):
    return (out.to(residual.dtype) + out_bias) * out_scale + (residual + res_bias) * res_scale


@contextlib.contextmanager
def composed_ops(enabled: bool):
    """The model's reference ops (kernels.reference, looked up at each call) as the composed ones."""
    if enabled:
        reference.rms_norm, reference.scaled_residual_add = composed_rms_norm, composed_merge
    try:
        yield
    finally:
        reference.rms_norm, reference.scaled_residual_add = WRITTEN


def block_ops(residual, attention_out, moe_out, params, grads):
    """A block's three norm pieces, forward and backward (reference.scaled_residual_add_rms_norm composes
    the module's current rms_norm and scaled_residual_add)."""
    norm_weight, merge = params[0], params[1:]
    normed_input = reference.rms_norm(residual, norm_weight, 1e-5).to(torch.bfloat16)
    mid, normed = reference.scaled_residual_add_rms_norm(attention_out, residual, *merge, norm_weight, 1e-5,
                                                         torch.bfloat16)
    merged = reference.scaled_residual_add(moe_out, mid, *merge)
    torch.autograd.backward((normed_input, normed, merged), grads)


def time_ops(spec: str, iters: int) -> tuple[float, float]:
    batch, seq, hidden = (int(v) for v in spec.split(","))
    gen = torch.Generator().manual_seed(0)
    residual = torch.randn(batch, seq, hidden, generator=gen).requires_grad_()
    outs = [torch.randn(batch, seq, hidden, generator=gen).bfloat16().requires_grad_() for _ in range(2)]
    params = [(torch.rand(hidden, generator=gen) + 0.5).requires_grad_() for _ in range(5)]
    grads = (torch.randn(batch, seq, hidden, generator=gen).bfloat16(),
             torch.randn(batch, seq, hidden, generator=gen).bfloat16(), torch.randn(batch, seq, hidden, generator=gen))
    times = {True: [], False: []}
    for i in range(iters + 3):
        for composed, record in times.items():
            with composed_ops(composed):
                start = time.perf_counter()
                block_ops(residual, *outs, params, grads)
                if i >= 3:
                    record.append(time.perf_counter() - start)
    return statistics.median(times[True]) * 1e3, statistics.median(times[False]) * 1e3


def time_model(preset: str, micro_batch: int, seq: int, iters: int, warmup: int) -> None:
    from megatron_zaya.config import model_config_from_preset
    from megatron_zaya.model import ZayaModel

    torch.manual_seed(0)
    config = model_config_from_preset(preset, seq_length=seq)
    model = ZayaModel(config).train()

    def step(index: int) -> None:
        gen = torch.Generator().manual_seed(index)
        tokens, labels = (torch.randint(0, config.vocab_size, (micro_batch, seq), generator=gen) for _ in range(2))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(tokens, labels=labels).token_losses.mean()
        loss.backward()

    times = {True: [], False: []}
    for i in range(warmup + iters):
        for composed, record in times.items():
            with composed_ops(composed):
                start = time.perf_counter()
                step(i)
                if i >= warmup:
                    record.append(time.perf_counter() - start)
    paired = statistics.median(c / w for c, w in zip(times[True], times[False]))
    print(f"{preset} {micro_batch} x {seq} forward+backward, bf16 autocast: composed ops "
          f"{statistics.median(times[True]):.3f} s, written-out {statistics.median(times[False]):.3f} s, "
          f"paired ratio {paired:.3f}x ({iters} pairs)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", nargs="+", default=list(SHAPES), help="B,S,D")
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: every CPU)")
    parser.add_argument("--model", default=None, metavar="PRESET", help="time whole forward+backward steps instead")
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--seq-length", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    keep_freed_memory()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads | {time.strftime('%Y-%m-%d %H:%M %Z')}")
    if args.model:
        time_model(args.model, args.micro_batch_size, args.seq_length, args.iters, args.warmup)
        return 0
    print(f"{'one block, B,S,D':<20}{'composed ms':>13}{'written-out ms':>16}")
    for spec in args.shape:
        composed_ms, written_ms = time_ops(spec, args.iters)
        print(f"{spec:<20}{composed_ms:>13.2f}{written_ms:>16.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
