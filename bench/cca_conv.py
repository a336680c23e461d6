"""CCA's causal convolution pair, forward + backward, at a preset's shape: reference.cca_causal_conv (two
channels-last Conv2d over the (B, S, C) activations as they are) against the same pair as Conv1d on a
(B, C, S) view (the layout it had before: copies of the input, output and gradients between layouts),
the two alternating call by call. bf16 autocast over fp32 weights, as in training on CPU.

    python bench/cca_conv.py --preset zaya1-100m --micro-batch-size 4
    python bench/cca_conv.py --preset zaya1-tiny --micro-batch-size 8 --dtype fp32

Prints the median milliseconds of each and their per-pair ratio, and both outputs' relative error
against a float64 run of the pair.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from megatron_zaya.config import model_config_from_preset  # noqa: E402
from megatron_zaya.kernels import reference  # noqa: E402


def conv1d_pair(packed, dw_weight, dw_bias, g_weight, g_bias):
    """The pair as Conv1d on the channels-first view of packed (B, S, C)."""
    context = dw_weight.shape[-1] - 1 + g_weight.shape[-1] - 1
    x = F.pad(packed.transpose(1, 2), (context, 0))
    y = F.conv1d(x, dw_weight, dw_bias, groups=packed.shape[-1])
    return F.conv1d(y, g_weight, g_bias, groups=packed.shape[-1] // g_weight.shape[1]).transpose(1, 2)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="zaya1-100m")
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--seq-length", type=int, default=None, help="default: the preset's")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: every CPU)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    config = model_config_from_preset(args.preset)
    seq = args.seq_length or config.seq_length
    channels = (config.num_attention_heads + config.num_query_groups) * config.kv_channels
    gen = torch.Generator().manual_seed(0)
    group_in = channels // (config.num_attention_heads + config.num_query_groups)
    weights = [0.5 * torch.randn(channels, 1, config.cca_depthwise_kernel, generator=gen),
               0.1 * torch.randn(channels, generator=gen),
               torch.randn(channels, group_in, config.cca_grouped_kernel, generator=gen) / group_in ** 0.5,
               0.1 * torch.randn(channels, generator=gen)]
    weights = [w.requires_grad_() for w in weights]
    bf16 = args.dtype == "bf16"
    packed = torch.randn(args.micro_batch_size, seq, channels, generator=gen)
    packed = packed.to(torch.bfloat16 if bf16 else torch.float32).requires_grad_()
    grad = torch.randn(packed.shape, generator=gen).to(packed.dtype)

    def step(fn):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = fn(packed, *weights)
        out.backward(grad)
        return out.detach()

    exact = reference.cca_causal_conv(packed.detach().double(), *[w.detach().double() for w in weights])
    variants = {"channels-last Conv2d (reference.cca_causal_conv)": reference.cca_causal_conv,
                "Conv1d on (B, C, S)": conv1d_pair}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(args.iters + 2):
        for name, fn in variants.items():
            start = time.perf_counter()
            out = step(fn)
            if i >= 2:
                times[name].append(time.perf_counter() - start)
            elif i == 0:
                error = ((out.double() - exact).norm() / exact.norm()).item()
                print(f"{name}: output relative error against float64 {error:.2e}")
    print(f"{args.preset}: packed ({args.micro_batch_size}, {seq}, {channels}) {args.dtype}, kernels "
          f"{config.cca_depthwise_kernel} then {config.cca_grouped_kernel} ({group_in} channels per group), "
          f"{torch.get_num_threads()} threads, forward + backward, median of {args.iters}")
    for name, t in times.items():
        print(f"  {name:48s} {1e3 * statistics.median(t):8.2f} ms")
    new, old = times.values()
    print(f"  per-pair speed-up median {statistics.median(o / n for o, n in zip(old, new)):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
