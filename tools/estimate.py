"""Cluster planner: per-GPU memory and step time of a ZAYA training layout, before you book the cluster.

    python tools/estimate.py --preset zaya1-base --gpus 1024 --cluster mi300x --seq-length 4096 \\
        --micro-batch-size 1 --global-batch-size 4096 --use-distributed-optimizer
    python tools/estimate.py --preset zaya1-base --gpus 1024 --cluster mi300x --seq-length 32768 \\
        --micro-batch-size 1 --global-batch-size 1024 --use-distributed-optimizer --context-parallel-size 2
    python tools/estimate.py --config examples/zaya1_base/phase3_32k.yaml --gpus 1024 --cluster mi300x

--config reads pretrain_zaya.py's YAML config of the run: the keys the plan depends on (preset, model
sizes, seq-length, batch sizes, parallel layout, ZeRO-1, recomputation, optimizer, packed documents)
set those flags (the command line still wins); its other training keys (lr, data, logging, ...) are
listed and left out, and a key pretrain_zaya.py does not know either stops the run. The Megatron-LM switches
pretrain_zaya.py accepts for compatibility (--swiglu, --normalization RMSNorm, --group-query-attention, ...:
megatron_zaya/megatron_flags.py) are accepted, and refused as there when a value asks for something else.
Prints weights, gradients, optimizer shards and activations (with and without recomputation) per GPU,
whether the layout fits (HBM minus --memory-reserve-fraction), and if not the single changes that make
it fit; then the step time split into compute, optimizer and communication, tokens/s and MFU.
The model behind the numbers and its assumptions: docs/PLANNER.md (megatron_zaya/planner/).
Exit status: 0 when the layout fits, 1 when it does not, 2 for invalid flags.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_zaya.config import PRESETS, ConfigError, model_config_from_preset  # noqa: E402
from megatron_zaya.flags import OneLineErrorParser, apply_training_config, command_line_dests  # noqa: E402
from megatron_zaya.planner.activations import DEFAULT_MODULES, POLICIES  # noqa: E402
from megatron_zaya.planner.hardware import CLUSTERS, Efficiency, cluster_from_preset  # noqa: E402
from megatron_zaya.planner.layout import RECOMPUTE_CHOICES, LayoutError, ParallelLayout  # noqa: E402
from megatron_zaya.planner.memory import GRAD_DTYPES, OPTIMIZERS  # noqa: E402
from megatron_zaya.planner.plan import Plan, PlanOptions, fixes, make_plan  # noqa: E402
from megatron_zaya.interrupts import quiet_when_the_reader_leaves  # noqa: E402
from megatron_zaya.model_vocab import pad_placeholder_vocab  # noqa: E402
from megatron_zaya.megatron_flags import (  # noqa: E402
    add_megatron_flags, check_moe_layer_freq, check_tool_megatron_flags, typed_flag_message)

MODEL_FLAGS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "vocab_size",
               "num_experts", "moe_ffn_hidden_size", "router_hidden_size", "make_vocab_size_divisible_by")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, metavar="FILE.yaml",
                   help="pretrain_zaya.py's YAML config: the keys the plan depends on, the rest left out")
    m = p.add_argument_group("model")
    m.add_argument("--preset", default="zaya1-base", help=f"one of {sorted(PRESETS)}")
    for flag in MODEL_FLAGS:
        m.add_argument("--" + flag.replace("_", "-"), type=int, default=None, help="override the preset")
    m.add_argument("--untie-embeddings-and-output-weights", action="store_true", help="a separate output layer")
    lay = p.add_argument_group("layout")
    lay.add_argument("--gpus", type=int, required=True)
    lay.add_argument("--tensor-model-parallel-size", type=int, default=1)
    lay.add_argument("--context-parallel-size", type=int, default=1)
    lay.add_argument("--expert-model-parallel-size", type=int, default=1)
    lay.add_argument("--use-distributed-optimizer", action="store_true", help="ZeRO-1 over DP x CP")
    lay.add_argument("--recompute", "--recompute-granularity", dest="recompute", choices=RECOMPUTE_CHOICES,
                     default="none", help="none, selective or full (--recompute-granularity: the training flag's name)")
    lay.add_argument("--recompute-activations", action="store_true", help="Megatron-LM's name of --recompute selective")
    lay.add_argument("--moe-layer-recompute", action="store_true",
                     help="--recompute selective with the moe module added (as in training)")
    lay.add_argument("--recompute-method", choices=("uniform", "block"), default=None,
                     help="with --recompute full: the plan models every block recomputed alone (uniform with "
                          "--recompute-num-layers 1, the default, or block with all the layers)")
    lay.add_argument("--recompute-num-layers", type=int, default=None)
    lay.add_argument("--recompute-modules", nargs="+", default=None, metavar="MODULE",
                     help="with --recompute selective: the pieces recomputed, by Megatron's names (layernorm, "
                          "core_attn, moe_act, moe: the whole MoE sublayer); default layernorm core_attn moe_act")
    lay.add_argument("--sequence-parallel", action="store_true",
                     help="the run uses --sequence-parallel: under TP > 1 the residuals', norms' and router's "
                          "activations are split over the TP ranks too")
    lay.add_argument("--seq-length", type=int, default=None, help="default: the preset's")
    lay.add_argument("--micro-batch-size", type=int, default=1)
    lay.add_argument("--global-batch-size", type=int, default=None, help="sequences per optimizer step (required)")
    lay.add_argument("--optimizer", choices=[*OPTIMIZERS, "adam"], default="adamw",
                     help="default adamw (the published-facts tables); with --config: muon, training's default; "
                          "Megatron-LM's adam is adamw, as in training")
    lay.add_argument("--grad-dtype", choices=GRAD_DTYPES, default="fp32",
                     help="fp32: as training accumulates and reduces gradients; bf16: a what-if only "
                          "(no training flag)")
    c = p.add_argument_group("cluster (a preset; any field can be overridden)")
    c.add_argument("--cluster", default="mi300x", help=f"one of {sorted(CLUSTERS)}")
    c.add_argument("--gpus-per-node", type=int, default=None)
    c.add_argument("--gpu-memory-gb", type=float, default=None,
                   help="HBM per GPU as vendors write it (\"192 GB\"), read as GiB (2**30 bytes)")
    c.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak per GPU")
    c.add_argument("--hbm-tbps", type=float, default=None)
    c.add_argument("--intra-node-gbps", type=float, default=None, help="per GPU, one direction, GB/s")
    c.add_argument("--inter-node-gbps", type=float, default=None, help="per GPU, one direction, GB/s")
    a = p.add_argument_group("assumptions (docs/PLANNER.md)")
    d = Efficiency()
    a.add_argument("--compute-efficiency", type=float, default=d.compute, help="achieved fraction of bf16 peak")
    a.add_argument("--hbm-efficiency", type=float, default=d.hbm)
    a.add_argument("--intra-node-efficiency", type=float, default=d.intra_node)
    a.add_argument("--inter-node-efficiency", type=float, default=d.inter_node)
    a.add_argument("--memory-reserve-fraction", type=float, default=PlanOptions.reserve_fraction)
    a.add_argument("--activation-policy", choices=sorted(POLICIES), default="gpu")
    a.add_argument("--routed-fraction", type=float, default=1.0, help="share of tokens routed to a real expert")
    a.add_argument("--reset-attention-mask", action="store_true",
                   help="packed documents kept apart (as in training): the segmented convolution's activations "
                        "and the shared (S x S) attention bias")
    a.add_argument("--no-overlap", action="store_true", help="expose the data-parallel collectives entirely")
    a.add_argument("--hierarchical-collectives", action="store_true", help="two-level (node, then network) rings")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    add_megatron_flags(p)        # --ffn-hidden-size, --swiglu, --normalization RMSNorm, ... as pretrain_zaya.py
    return p


def check_whole_nodes(gpus: int, gpus_per_node: int) -> None:
    """--gpus fills whole nodes of --gpus-per-node (or lies within one node); LayoutError otherwise."""
    if gpus > gpus_per_node and gpus % gpus_per_node:
        raise LayoutError(f"--gpus={gpus} is not a whole number of nodes of --gpus-per-node={gpus_per_node} "
                          f"(use a multiple of {gpus_per_node}, or at most {gpus_per_node} GPUs on one node)")


def resolve_training_names(args, num_layers: int) -> None:
    """Training's other names for what the plan takes (in place), as pretrain_zaya.py reads them:
    --recompute-activations and --moe-layer-recompute mean selective (the latter adding moe); full
    recomputation is planned block by block, so a --recompute-method / --recompute-num-layers asking for
    anything else is a LayoutError."""
    if args.recompute_activations or args.moe_layer_recompute:
        if args.recompute == "full":
            raise LayoutError("--recompute-activations / --moe-layer-recompute mean --recompute selective, not full")
        args.recompute = "selective"
    if args.moe_layer_recompute:
        args.recompute_modules = list(args.recompute_modules or DEFAULT_MODULES) + ["moe"]
    if args.recompute_method is not None or args.recompute_num_layers is not None:
        if args.recompute != "full":
            raise LayoutError("--recompute-method / --recompute-num-layers go with --recompute full")
        method, layers = args.recompute_method or "uniform", args.recompute_num_layers
        if not (layers is None or (method == "uniform" and layers == 1) or (method == "block" and layers >= num_layers)):
            raise LayoutError(f"--recompute-method {method} --recompute-num-layers {layers}: the planner models full "
                              f"recomputation of every block alone (uniform 1, or block {num_layers})")


SELECTIVE_SETTINGS = ("recompute_activations", "moe_layer_recompute", "recompute_modules")


def leave_selective(parser: argparse.ArgumentParser, args, argv) -> str:
    """What the change to --recompute full takes away from this run's selective settings (training refuses full
    beside them), where the run gave them: a command-line flag is left out ("without --recompute-modules"), an
    on/off key of --config turned off (--no-recompute-activations, added by --config), and --config's
    recompute-modules taken out of the file (no flag empties a list). Read before resolve_training_names."""
    given = command_line_dests(argv, build_parser)
    without = [f"--{d.replace('_', '-')}" for d in SELECTIVE_SETTINGS if d in given and getattr(args, d)]
    off = [f"--no-{d.replace('_', '-')}" for d in SELECTIVE_SETTINGS[:2] if parser.get_default(d) and getattr(args, d)]
    text = "".join(" " + flag for flag in off)
    if without:
        text += f", without {' or '.join(without)}"
    if parser.get_default("recompute_modules"):
        text += f", with the recompute-modules key taken out of {args.config}"
    return text


def plan_from_args(args) -> Plan:
    overrides = {f: getattr(args, f) for f in MODEL_FLAGS if getattr(args, f) is not None}
    if args.untie_embeddings_and_output_weights:
        overrides["untie_embeddings_and_output_weights"] = True
    pad_placeholder_vocab(model_config_from_preset(args.preset), overrides,    # as pretrain_zaya.py pads it
                          args.tensor_model_parallel_size)
    config = model_config_from_preset(args.preset, **overrides)
    check_moe_layer_freq(args, config.num_layers)
    resolve_training_names(args, config.num_layers)
    seq = config.seq_length if args.seq_length is None else args.seq_length
    if seq > config.max_position_embeddings:
        config = config.replace(max_position_embeddings=seq)
    cluster = cluster_from_preset(args.cluster, gpus_per_node=args.gpus_per_node, memory_gb=args.gpu_memory_gb,
                                  peak_bf16_tflops=args.peak_tflops, hbm_tbps=args.hbm_tbps,
                                  intra_node_gbps=args.intra_node_gbps, inter_node_gbps=args.inter_node_gbps)
    check_whole_nodes(args.gpus, cluster.gpus_per_node)
    if args.sequence_parallel and args.tensor_model_parallel_size == 1:     # as training turns it off
        print("--sequence-parallel is off: it splits sequences over tensor-parallel ranks, and "
              "--tensor-model-parallel-size is 1", file=sys.stderr)
        args.sequence_parallel = False
    layout = ParallelLayout(args.gpus, seq, args.micro_batch_size, args.global_batch_size,
                            args.tensor_model_parallel_size, args.context_parallel_size,
                            args.expert_model_parallel_size, args.use_distributed_optimizer, args.recompute,
                            tuple(args.recompute_modules or ()), args.sequence_parallel)
    eff = Efficiency(args.compute_efficiency, args.hbm_efficiency, args.intra_node_efficiency, args.inter_node_efficiency)
    optimizer = "adamw" if args.optimizer == "adam" else args.optimizer       # as training reads it
    options = PlanOptions(optimizer, args.grad_dtype, args.activation_policy, args.memory_reserve_fraction,
                          not args.no_overlap, args.hierarchical_collectives, args.routed_fraction,
                          args.reset_attention_mask)
    return make_plan(config, layout, cluster, eff, options)


def gb(n: float) -> str:
    return f"{n / 1e9:8.2f} GB"


def row(label: str, value: str) -> str:
    return f"  {label:<42}{value}"


def secs(t: float) -> str:
    return f"{t:8.3f} s"


def summary(plan: Plan, found: list[tuple[str, Plan]]) -> dict:
    t, s, a = plan.time, plan.state, plan.activations
    return {
        "fits": plan.fits, "memory_total_gb": plan.memory_total / 1e9, "memory_usable_gb": plan.memory_usable / 1e9,
        "weights_gb": s.weights / 1e9, "gradients_gb": s.gradients / 1e9, "optimizer_gb": s.optimizer / 1e9,
        "autocast_copies_gb": s.autocast_copies / 1e9,
        "activations_gb": a.stored / 1e9, "activations_no_recompute_gb": a.stored_no_recompute / 1e9,
        "backward_transient_gb": a.backward_transient / 1e9,
        "step_time_s": t.total, "compute_s": t.compute, "optimizer_s": t.optimizer, "dp_comm_s": t.dp_comm,
        "dp_comm_exposed_s": t.dp_comm_exposed, "cp_comm_s": t.cp_comm, "ep_comm_s": t.ep_comm, "tp_comm_s": t.tp_comm,
        "tokens_per_s": plan.tokens_per_second, "mfu": plan.mfu,
        "data_parallel": plan.layout.data_parallel, "micro_batches": plan.layout.micro_batches,
        "fixes": [d for d, _ in found],
    }


def nodes_text(gpus: int, gpus_per_node: int) -> str:
    """'4 nodes of 8', or '1 node, 4 of its 8 GPUs' for a layout within one node."""
    if gpus < gpus_per_node:
        return f"1 node, {gpus} of its {gpus_per_node} GPUs"
    nodes = gpus // gpus_per_node
    return f"{nodes} node{'s' if nodes > 1 else ''} of {gpus_per_node}"


def report(plan: Plan, found: list[tuple[str, Plan]]) -> str:
    """The printed plan; `found`: the changes that make it fit (fixes), when it does not."""
    L, c, t, s, a = plan.layout, plan.cluster, plan.time, plan.state, plan.activations
    e = plan.efficiency
    lines = [
        f"cluster: {c.device} x {L.gpus} ({nodes_text(L.gpus, c.gpus_per_node)}), {c.memory_gb:g} GiB, {c.peak_bf16_tflops:g} TFLOP/s bf16, HBM {c.hbm_tbps:g} TB/s, "
        f"fabric {c.intra_node_gbps:g} GB/s"
        f"{f' ({c.intra_node_links} links, a full mesh)' if c.intra_node_links else ''}, network "
        f"{c.inter_node_gbps:g} GB/s per GPU",
        f"layout: TP={L.tp_text} CP={L.context_parallel} EP={L.expert_parallel} DP={L.data_parallel} "
        f"ZeRO-1={'on' if L.zero1 else 'off'} recompute={L.recompute_text}; seq {L.seq_length}, micro batch "
        f"{L.micro_batch_size}, global batch {L.global_batch_size} ({L.micro_batches} "
        f"micro-batch{'es' if L.micro_batches != 1 else ''} per step); "
        f"optimizer {plan.options.optimizer}, grads {plan.options.grad_dtype}",
        "",
        "memory per GPU",
        row("weights (bf16, router fp32)" if L.zero1 else "weights (fp32, their own masters)",
            gb(s.weights)),
        row(f"gradients ({plan.options.grad_dtype} main grads)", gb(s.gradients)),
        row("master + optimizer state (largest shard)" if L.zero1 else "optimizer state (no masters)",
            gb(s.optimizer)),
        *([] if L.zero1 else [row("bf16 weight copies kept for the backward", gb(s.autocast_copies))]),
        row(f"activations, recompute={L.recompute_text}", gb(a.stored)),
        f"    (no recomputation: {a.stored_no_recompute / 1e9:.2f} GB; one block {a.per_layer_no_recompute / 1e9:.3f} GB, "
        f"head and loss {a.outer / 1e9:.3f} GB)",
        row("logits gradient at backward start", gb(a.backward_transient)),
        row("total", gb(plan.memory_total)) + f"   of {plan.memory_usable / 1e9:.1f} GB usable "
        f"({c.memory_gb:g} GiB = {c.memory_bytes / 1e9:.1f} GB less {plan.options.reserve_fraction:.0%} reserve)",
        f"  -> {'FITS' if plan.fits else 'DOES NOT FIT'}",
    ]
    if not plan.fits:
        if found:
            lines.append("  changes that make it fit:")
            for description, fixed in found:
                lines.append(f"    - {description}: {fixed.memory_total / 1e9:.1f} GB, step {fixed.time.total:.2f} s")
        else:
            lines.append("  no single change found that fits: a larger-memory cluster or a smaller model")
    lines += [
        "",
        f"step time (compute at {e.compute:.0%} of peak, network at {e.inter_node:.0%} and fabric at {e.intra_node:.0%} of line rate)",
        row("compute (fwd+bwd" + ("+recompute)" if L.recompute == "full" or L.recomputes_moe else ")"),
            secs(t.compute)),
        row("optimizer step", secs(t.optimizer)),
        row("data-parallel comm", secs(t.dp_comm)) + f"  ({t.dp_comm_exposed:.3f} s exposed after overlap)",
        row("context-parallel comm", secs(t.cp_comm)),
        row("expert-parallel comm", secs(t.ep_comm)),
        row("tensor-parallel comm", secs(t.tp_comm)),
        row("step", secs(t.total)),
        f"tokens/s: {plan.tokens_per_second:,.0f} ({plan.tokens_per_second / L.gpus:,.0f} per GPU); "
        f"model TFLOP/s per GPU: {t.model_flops_per_gpu / t.total / 1e12:.1f}; MFU: {plan.mfu:.1%}",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = build_parser()
    if parser.parse_known_args(argv)[0].config:
        parser.set_defaults(optimizer="muon")      # a training config without an optimizer key trains with Muon
    left_out = apply_training_config(parser, argv, "training keys that do not change the plan")
    training_keys = {str(k).lstrip("-").replace("-", "_"): v for k, v in (left_out or {}).items()}
    if left_out is not None and training_keys.get("bf16") is not True:
        print("--config: the run trains in fp32 (no bf16: true), while the plan assumes --bf16 (bf16 weights, "
              "activations and matmuls; pretrain_zaya.py's default is fp32): expect more memory and time than shown",
              file=sys.stderr)
    args = parser.parse_args(argv)
    if training_keys.get("tokenizer_type", "GPTSentencePieceTokenizer") != "NullTokenizer" and \
            ("tokenizer_model" in training_keys or "vocab_file" in training_keys) and args.vocab_size is None:
        print("--config: the run's vocabulary is its tokenizer's, which the planner does not read: the plan uses "
              "the preset's; pass --vocab-size N (pretrain_zaya.py --dry-run prints N)", file=sys.stderr)
    check_tool_megatron_flags(parser, args)
    if args.preset not in PRESETS:       # (named first: a typo'd preset is the mistake to fix, not the batch size)
        parser.error(f"--preset={args.preset}: choose one of {sorted(PRESETS)}")
    if args.global_batch_size is None:
        parser.error("--global-batch-size is required (on the command line or in --config)")
    leave = leave_selective(parser, args, argv)
    try:
        plan = plan_from_args(args)
    except (ConfigError, LayoutError, ValueError) as err:
        parser.error(typed_flag_message(str(err), args))
    found = [] if plan.fits else fixes(plan, leave_selective=leave)
    print(json.dumps(summary(plan, found), indent=2) if args.json else report(plan, found))
    return 0 if plan.fits else 1


if __name__ == "__main__":
    sys.exit(quiet_when_the_reader_leaves(main))
