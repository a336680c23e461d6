"""Parameter counts, FLOPs per token and KV-cache size of a ZAYA model.

    python tools/model_stats.py --preset zaya1-base
    python tools/model_stats.py --preset zaya1-tiny --seq-length 1024 --num-layers 8
    python tools/model_stats.py --config examples/zaya1_base/phase1_4k.yaml

Model flags are pretrain_zaya.py's (Megatron-LM's names, e.g. --num-query-groups, --moe-ffn-hidden-size or
--ffn-hidden-size), and so are the Megatron-LM switches it accepts for compatibility (--swiglu,
--normalization RMSNorm, ...: megatron_zaya/megatron_flags.py), refused here as there when a value asks for
something else; --config reads a training YAML for them, leaving its other keys out. With tokenizer flags
(--tokenizer-type, --tokenizer-model, ...; a training YAML has them) the vocabulary is the tokenizer's, padded as
pretrain_zaya.py pads it (--make-vocab-size-divisible-by, --tensor-model-parallel-size), unless --vocab-size gives
it; without --tokenizer-model (nor GPT-2's --vocab-file), the preset's, padded to a --make-vocab-size-divisible-by
given without --vocab-size (as pretrain_zaya.py pads the placeholder: model_vocab.pad_placeholder_vocab).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_zaya.config import PRESETS, ConfigError  # noqa: E402
from megatron_zaya.flags import (  # noqa: E402
    MODEL_FLAGS, OneLineErrorParser, add_tokenizer_arguments, apply_training_config)
from megatron_zaya.model.accounting import (  # noqa: E402
    attention_macs_per_token, count_parameters, decode_state_bytes_per_sequence, forward_flops_per_token,
    kv_cache_bytes_per_token, matmul_macs_per_token)
from megatron_zaya.interrupts import quiet_when_the_reader_leaves  # noqa: E402
from megatron_zaya.megatron_flags import (  # noqa: E402
    add_megatron_flags, check_moe_layer_freq, check_tool_megatron_flags, typed_flag_message)
from megatron_zaya.model_vocab import model_config_as_trained  # noqa: E402


def human(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.4g}{unit}"
    return f"{n:.4g}"


def vocabulary_line(config, tokenizer, args) -> str:
    """Where the vocabulary comes from: the tokenizer's, padded (as pretrain_zaya.py sizes it), --vocab-size, or
    the preset's when no tokenizer file is given."""
    if tokenizer is None:
        source = "the preset's" if args.vocab_size is None else "--vocab-size"
        if args.vocab_size is None and args.make_vocab_size_divisible_by is not None:
            source += f" padded to a multiple of --make-vocab-size-divisible-by={args.make_vocab_size_divisible_by}"
        return (f"vocabulary: {config.vocab_size:,}, {source} (no --tokenizer-model given; pretrain_zaya.py pads "
                f"its tokenizer's)")
    name = f"{args.tokenizer_type} {args.tokenizer_model or args.vocab_file}"
    if args.vocab_size is not None:
        return f"vocabulary: {config.vocab_size:,}, --vocab-size (the tokenizer {name} has {tokenizer.vocab_size:,})"
    return (f"vocabulary: {config.vocab_size:,}, the tokenizer's {tokenizer.vocab_size:,} ({name}) padded as "
            f"pretrain_zaya.py pads it")


def main(argv=None) -> int:
    parser = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None, metavar="FILE.yaml",
                        help="pretrain_zaya.py's YAML config: its model keys, the rest left out")
    parser.add_argument("--preset", default="zaya1-base", help=f"one of {sorted(PRESETS)}")
    for flag, kind in MODEL_FLAGS.items():
        parser.add_argument("--" + flag.replace("_", "-"), type=kind, default=None,
                            help="for attention FLOPs (default: the preset's)" if flag == "seq_length" else None)
    parser.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    tokenizer = parser.add_argument_group("tokenizer (the vocabulary, as pretrain_zaya.py sizes it)")
    add_tokenizer_arguments(tokenizer, None)
    tokenizer.add_argument("--tensor-model-parallel-size", type=int, default=1,
                           help="the padded vocabulary is a multiple of it too (as in training)")
    add_megatron_flags(parser)      # --ffn-hidden-size, --swiglu, --normalization RMSNorm, ... as pretrain_zaya.py
    apply_training_config(parser, argv, "keys that do not change the model")
    args = parser.parse_args(argv)
    check_tool_megatron_flags(parser, args)
    if args.seq_length is not None and args.seq_length < 1:
        parser.error(f"--seq-length={args.seq_length} must be >= 1 (omit it for the preset's)")
    overrides = {flag: getattr(args, flag) for flag in MODEL_FLAGS if flag != "seq_length" and getattr(args, flag) is not None}
    if args.untie_embeddings_and_output_weights:
        overrides["untie_embeddings_and_output_weights"] = True
    if args.tensor_model_parallel_size < 1:
        parser.error(f"--tensor-model-parallel-size={args.tensor_model_parallel_size} must be >= 1")
    try:
        config, tokenizer, warning = model_config_as_trained(args.preset, overrides, args,
                                                             args.tensor_model_parallel_size)
        check_moe_layer_freq(args, config.num_layers)
    except (ConfigError, ValueError) as err:      # (UserInputError is a ValueError)
        parser.error(typed_flag_message(str(err), args))
    if warning:
        print(f"WARNING {warning}", file=sys.stderr)
    seq = args.seq_length if args.seq_length is not None else config.seq_length
    counts = count_parameters(config)
    active = counts.active_non_embedding(config.num_experts)
    fwd = forward_flops_per_token(config, seq)
    print(f"model: {args.preset}  layers={config.num_layers} hidden={config.hidden_size} "
          f"heads={config.num_attention_heads}/{config.num_query_groups}x{config.kv_channels} "
          f"experts={config.num_experts}x{config.moe_ffn_hidden_size} vocab={config.vocab_size}")
    print(vocabulary_line(config, tokenizer, args))
    print(f"non-embedding parameters, total:   {counts.non_embedding:>16,}  ({human(counts.non_embedding)})")
    print(f"non-embedding parameters, active:  {active:>16,}  ({human(active)})")
    print(f"embedding parameters:              {counts.embedding:>16,}  ({human(counts.embedding)})")
    print(f"total parameters:                  {counts.total:>16,}  ({human(counts.total)})")
    print(f"total active parameters:           {active + counts.embedding:>16,}  ({human(active + counts.embedding)})")
    print(f"forward FLOPs per token (S={seq}):  {fwd:>16,.0f}  ({human(fwd)})")
    for name, macs in matmul_macs_per_token(config).items():
        print(f"    {name:<24} {2 * macs:>16,}")
    print(f"    {'causal_attention':<24} {2 * attention_macs_per_token(config, seq):>16,.0f}")
    print(f"training FLOPs per token (3x):     {3 * fwd:>16,.0f}  ({human(3 * fwd)})")
    kv = kv_cache_bytes_per_token(config)
    print(f"KV-cache bytes per token (bf16):   {kv:>16,}  ({kv / 1024:.1f} KiB)")
    print(f"decode state per sequence (bf16):  {decode_state_bytes_per_sequence(config):>16,} bytes (constant)")
    return 0


if __name__ == "__main__":
    sys.exit(quiet_when_the_reader_leaves(main))
