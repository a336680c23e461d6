"""What packed documents (--reset-attention-mask) cost CCA's convolutions: forward+backward of
`CompressedConvAttention.causal_conv` on the plain path (two Conv1d) and on the segmented one
(kernels.reference.cca_causal_conv_segmented, restarting at every document), same shapes.

    python bench/packed_documents.py --preset zaya1-100m --micro-batch-size 4 --seq-length 512 --document-length 128
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from megatron_zaya.config import model_config_from_preset  # noqa: E402
from megatron_zaya.model.cca import CompressedConvAttention, lag_visibility  # noqa: E402


def seconds_per_pass(attention, packed, visible, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        attention.causal_conv(packed, None, visible).sum().backward()
    return (time.perf_counter() - start) / repeats


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="zaya1-100m")
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--seq-length", type=int, default=512)
    p.add_argument("--document-length", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--trials", type=int, default=3)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    config = model_config_from_preset(args.preset)
    attention = CompressedConvAttention(config)
    b, s = args.micro_batch_size, args.seq_length
    channels = (config.num_attention_heads + config.num_query_groups) * config.kv_channels
    packed = torch.randn(b, s, channels, requires_grad=True)
    document = torch.arange(s) // args.document_length
    mask = torch.tril(torch.ones(s, s, dtype=torch.bool)) & (document[:, None] == document[None, :])
    visible = lag_visibility(mask[None, None].expand(b, 1, s, s), attention.conv_context)
    print(f"{args.preset}: {b} x {s} tokens, {channels} channels, documents of {args.document_length}, fp32, "
          f"{torch.get_num_threads()} threads; forward+backward per layer, best of {args.trials} x {args.repeats}")
    for name, vis in (("plain (two Conv1d)", None), ("segmented (restarts per document)", visible)):
        seconds_per_pass(attention, packed, vis, 1)                      # warm-up
        best = min(seconds_per_pass(attention, packed, vis, args.repeats) for _ in range(args.trials))
        print(f"  {name:<36} {1000 * best:7.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
