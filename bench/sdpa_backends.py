"""Which SDPA kernel CCA's attention gets on this device, at ZAYA1-base's head shapes (8 query heads,
2 K/V heads of 128, bf16): causal, packed documents (an additive bias), and a context-parallel chunk's
lower-right causal bias; each with the grouped K/V heads as they are and as `cca.kv_for_sdpa` hands them
to SDPA (repeated where only that keeps SDPA off its math path, which keeps the S x S scores).

    python bench/sdpa_backends.py                     # on a GPU, or on CPU (its own choices)
    python bench/sdpa_backends.py --seq-length 4096

The answer is SDPA's own choice function (torch._fused_sdp_choice), the one the model asks; "math" on a
GPU means S x S probabilities per head in fp32 kept for the backward.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402
from torch.nn.attention.bias import causal_lower_right  # noqa: E402

from megatron_zaya.model import recompute  # noqa: E402
from megatron_zaya.model.cca import kv_for_sdpa  # noqa: E402
from megatron_zaya.model.documents import additive_bias, document_attention_mask  # noqa: E402


def backend_name(q, k, v, mask, gqa: bool) -> str:
    if isinstance(mask, type(causal_lower_right(1, 1))):
        return "math (S x S kept)" if recompute.sdpa_keeps_scores(q, k, v, mask, gqa) else "fused (no S x S)"
    choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, mask is None, enable_gqa=gqa)
    return SDPBackend(choice).name.lower()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    s, groups = args.seq_length, args.heads // args.kv_heads
    q = torch.randn(1, args.heads, s, args.head_dim, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(1, args.kv_heads, s, args.head_dim, device=device, dtype=torch.bfloat16) for _ in range(2))
    ids = (torch.arange(s, device=device) // max(1, s // 4))[None]
    half = s // 4
    cases = [("causal", q, None), ("packed documents (bias)", q, additive_bias(document_attention_mask(ids, ids),
                                                                                 torch.bfloat16)),
             ("CP chunk (lower-right causal)", q[:, :, :half], causal_lower_right(half, s))]
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}: {args.heads} query / {args.kv_heads} K/V heads of {args.head_dim}, "
          f"sequence {s}, bf16")
    print("| attention | grouped K/V as they are | as kv_for_sdpa hands them |")
    print("|---|---|---|")
    for label, query, mask in cases:
        grouped = backend_name(query, k, v, mask, True)
        k2, v2, gqa, _ = kv_for_sdpa(query, k, v, mask, groups)
        chosen = backend_name(query, k2, v2, mask, gqa)
        print(f"| {label} | {grouped} | {chosen}{'' if gqa else ' (K/V repeated)'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
