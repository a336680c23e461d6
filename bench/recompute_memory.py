"""Activation memory of a bf16 ZAYA model on CPU under each recomputation choice, measured with the C
allocator, beside the planner's numbers (planner/activations.py).

    python bench/recompute_memory.py                       # zaya1-tiny at D 256, F 1024, 6 layers, 1 x 256
    python bench/recompute_memory.py --num-layers 2 --seq-length 64 --modules moe "moe_act moe" --json r.json

For each choice, two steps (the first warms up lazy state): the bytes the forward leaves allocated
(what it keeps for the backward) and the peak above the step's start during the backward, per token,
read from glibc's `mallinfo2` after every operator. The planner's "kept" is its stored bytes less the
unit being recomputed in the backward (recompute_live); its "peak" is its stored bytes plus the fused
cross-entropy's logits gradient (none on CPU's reference path): the measured peak also holds the
backward's gradients in flight, which the planner does not count. Unlike the planner tests' saved-tensor
hooks, the allocator also sees what hooks set inside the model keep, which is how `moe_act` inside a
rerun `moe` sublayer once kept 50% more.
Linux with glibc only.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from megatron_zaya.config import model_config_from_preset  # noqa: E402
from megatron_zaya.model import ZayaModel  # noqa: E402
from megatron_zaya.planner.activations import activation_memory, measured_routing  # noqa: E402

CHOICES = ("none", "selective", "moe", "moe_act moe", "layernorm core_attn moe_act moe", "full")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


class MallocInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def glibc():
    """glibc with every allocation kept in its arena (no mmap, no trim), so that `allocated` sees all."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallocInfo
    except (OSError, AttributeError):
        sys.exit("bench/recompute_memory.py needs glibc 2.33 or later (mallinfo2); this is not Linux with glibc")
    libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
    return libc


class PeakAfterEachOp(TorchDispatchMode):
    def __init__(self, allocated):
        super().__init__()
        self.allocated, self.peak = allocated, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, self.allocated())
        return out


def recompute_setting(choice: str) -> tuple[str, list[str] | None]:
    if choice in ("none", "selective", "full"):
        return choice, None
    return "selective", choice.split()


def measure(config, batch, seq, choice, allocated):
    """(bytes the forward keeps, peak bytes of forward + backward) of the second of two steps."""
    torch.manual_seed(0)
    model = ZayaModel(config)
    model.store_weights_in(torch.bfloat16)
    recompute, modules = recompute_setting(choice)
    if recompute != "none":
        model.set_recompute(recompute, modules=modules)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (batch, seq), generator=generator)
    labels = torch.randint(0, config.vocab_size, (batch, seq), generator=generator)
    for _ in range(2):
        gc.collect()
        start = allocated()
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION), PeakAfterEachOp(allocated) as mode:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(tokens, labels=labels)
            kept = allocated() - start
            out.token_losses.sum().backward()
        routing = out.routing
        del out
    return kept, mode.peak - start, *measured_routing(routing)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="zaya1-tiny")
    parser.add_argument("--num-layers", type=int, default=6)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--moe-ffn-hidden-size", type=int, default=1024)
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--micro-batch-size", type=int, default=1)
    parser.add_argument("--seq-length", type=int, default=256)
    parser.add_argument("--modules", nargs="+", default=list(CHOICES), metavar="CHOICE",
                        help="none, selective, full, or a quoted list of --recompute-modules names")
    parser.add_argument("--json", help="also write the rows (bytes per token) to this file")
    args = parser.parse_args(argv)
    libc = glibc()

    def allocated() -> int:
        info = libc.mallinfo2()
        return info.uordblks + info.hblkhd

    torch.set_num_threads(1)
    heads = max(1, args.hidden_size // 32)
    config = model_config_from_preset(
        args.preset, num_layers=args.num_layers, hidden_size=args.hidden_size, num_attention_heads=heads,
        num_query_groups=min(2, heads), kv_channels=32, router_hidden_size=max(8, args.hidden_size // 4),
        moe_ffn_hidden_size=args.moe_ffn_hidden_size, vocab_size=args.vocab_size)
    tokens = args.micro_batch_size * args.seq_length
    print(f"{args.preset}: D {args.hidden_size}, F {args.moe_ffn_hidden_size}, {args.num_layers} layers, "
          f"vocab {args.vocab_size}, micro batch {args.micro_batch_size} x {args.seq_length}; bytes per token")
    print(f"{'recompute':34s} {'kept':>9s} {'planner':>9s} {'peak':>9s} {'planner':>9s}")
    rows = {}
    for choice in args.modules:
        recompute, modules = recompute_setting(choice)
        kept, peak, routed, padded = measure(config, args.micro_batch_size, args.seq_length, choice, allocated)
        plan = activation_memory(config, args.seq_length, args.micro_batch_size, recompute, policy="cpu-flash",
                                 recompute_modules=modules, routed_fraction=routed, padded_fraction=padded)
        row = {"kept": kept / tokens, "planner_kept": (plan.stored - plan.recompute_live) / tokens,
               "peak": peak / tokens, "planner_peak": (plan.stored + plan.backward_transient) / tokens}
        rows[choice] = row
        print(f"{choice:34s} " + " ".join(f"{value:9,.0f}" for value in row.values()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
