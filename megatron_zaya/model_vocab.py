"""The model's vocabulary as pretrain_zaya.py sizes it, shared by the trainer (arguments.validate,
training/setup.py) and the tools that count its parameters (tools/model_stats.py, tools/estimate.py).

The vocabulary is the tokenizer's, padded to a multiple of --make-vocab-size-divisible-by that
--tensor-model-parallel-size divides (tokenizer_base.pad_vocab_size), unless --vocab-size gives the model's
padded vocabulary itself; the preset's vocabulary is only a placeholder for the tokenizer's. Megatron-LM's
--vocab-size with NullTokenizer and TikTokenizer is the tokenizer's size instead (megatron_tokenizer_vocab_size).
"""
from __future__ import annotations

import argparse

from megatron_zaya.config import ModelConfig, model_config_from_preset
from megatron_zaya.data.tokenizer import TOKENIZER_DESTS, build_tokenizer, tiktoken_options
from megatron_zaya.data.tokenizer_base import pad_vocab_size
from megatron_zaya.errors import UserInputError
from megatron_zaya.flags import build_parser


def megatron_tokenizer_vocab_size(args: argparse.Namespace) -> str | None:
    """Where Megatron-LM reads --vocab-size as the TOKENIZER's size, not the model's, whose
    vocabulary is then the tokenizer's padded, as Megatron pads it:
    - `--tokenizer-type NullTokenizer --vocab-size N` (no --tokenizer-model): ids 0..N-1, EOD = N;
      rewritten into this project's form, --tokenizer-model N;
    - `--tokenizer-type TikTokenizer --vocab-size N`: special tokens and ranks together; moved to
      `tokenizer_vocab_size`.
    With the other types Megatron-LM ignores --vocab-size; here it is the model's padded vocabulary: said in
    the returned warning."""
    args.tokenizer_vocab_size = None
    if args.tokenizer_type == "NullTokenizer" and args.tokenizer_model is None and args.vocab_size is not None:
        args.tokenizer_model, args.vocab_size = str(args.vocab_size), None
    elif args.tokenizer_type == "TikTokenizer" and args.vocab_size is not None:
        args.tokenizer_vocab_size, args.vocab_size = args.vocab_size, None
    elif args.vocab_size is not None and args.tokenizer_type != "NullTokenizer":
        return (f"--vocab-size={args.vocab_size} with --tokenizer-type {args.tokenizer_type}: the model's vocabulary "
                f"(embedding rows) here, where Megatron-LM ignores the flag for this type and pads the tokenizer's")
    return None


def pad_placeholder_vocab(preset_model: ModelConfig, overrides: dict, tensor_parallel_size: int = 1) -> None:
    """A --make-vocab-size-divisible-by without --vocab-size (in `overrides`, in place): the preset's
    vocabulary is a placeholder that the tokenizer's, padded, replaces (vocab_from_tokenizer), so it is padded
    as a tokenizer's is (to a multiple of the flag that `tensor_parallel_size` divides), not refused as a
    --vocab-size nobody gave."""
    if "vocab_size" not in overrides and overrides.get("make_vocab_size_divisible_by", 0) >= 1:
        overrides["vocab_size"] = pad_vocab_size(preset_model.vocab_size, overrides["make_vocab_size_divisible_by"],
                                                 tensor_parallel_size)


def vocab_from_tokenizer(model: ModelConfig, vocab_size_flag: int | None, tokenizer, tokenizer_model) -> ModelConfig:
    """`model` with the tokenizer's padded vocabulary, or with --vocab-size (`vocab_size_flag`, already the
    model's) when that is given and holds every token; UserInputError when it is smaller."""
    if vocab_size_flag is None:
        return model.replace(vocab_size=tokenizer.padded_vocab_size)
    if model.vocab_size < tokenizer.vocab_size:
        raise UserInputError(f"--vocab-size={model.vocab_size} is smaller than the tokenizer's vocabulary "
                             f"({tokenizer.vocab_size} tokens in {getattr(tokenizer, 'model_path', tokenizer_model)})")
    return model


def model_config_as_trained(preset: str, overrides: dict, args: argparse.Namespace, tensor_parallel_size: int = 1):
    """For a tool: the model config pretrain_zaya.py trains from --preset `preset`, the model flags
    `overrides` (--vocab-size among them as the tool parsed it) and the tokenizer flags in `args` (data/
    tokenizer.py's TOKENIZER_DESTS; `tokenizer_type` None means pretrain_zaya.py's default). Returns (config,
    tokenizer, warning): without a tokenizer to read (no --tokenizer-model nor GPT-2's --vocab-file: a training
    config whose launch script adds it) the preset's vocabulary or --vocab-size, and tokenizer None; `warning`
    is megatron_tokenizer_vocab_size's. Raises ConfigError / UserInputError naming the flag."""
    args.vocab_size = overrides.pop("vocab_size", None)
    warning = None
    if any(getattr(args, dest, None) is not None for dest in TOKENIZER_DESTS):
        if args.tokenizer_type is None:
            args.tokenizer_type = build_parser().get_default("tokenizer_type")
        warning = megatron_tokenizer_vocab_size(args)
    if args.vocab_size is not None:
        overrides["vocab_size"] = args.vocab_size
    pad_placeholder_vocab(model_config_from_preset(preset), overrides, tensor_parallel_size)   # as arguments.validate
    if getattr(args, "tokenizer_model", None) is None and getattr(args, "vocab_file", None) is None:
        return model_config_from_preset(preset, **overrides), None, warning
    model = model_config_from_preset(preset, **overrides)
    tokenizer = build_tokenizer(args.tokenizer_type, args.tokenizer_model, model.make_vocab_size_divisible_by,
                                tensor_parallel_size, vocab_file=args.vocab_file, merge_file=args.merge_file,
                                **tiktoken_options(args))
    return vocab_from_tokenizer(model, args.vocab_size, tokenizer, args.tokenizer_model), tokenizer, warning
