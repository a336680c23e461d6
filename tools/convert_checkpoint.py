"""Convert between megatron-zaya's sharded checkpoints and Hugging Face ZAYA folders.

    # sharded checkpoint (any layout; the --save folder or one iter_NNNNNNN folder) -> HF folder,
    # with the tokenizer the model was trained with (the training run's, or the same flags as training)
    python tools/convert_checkpoint.py to-hf runs/tiny/ckpt hf/tiny [--dtype bf16] [--max-shard-size 5GB] \
        [--tokenizer-type HuggingFaceTokenizer --tokenizer-model tokenizer.json]
    # HF folder (one model.safetensors, or shards with model.safetensors.index.json, as published) ->
    # sharded checkpoint in any layout (model weights; train from it with --load DIR --finetune)
    python tools/convert_checkpoint.py from-hf hf/tiny runs/tiny-tp2 --tensor-model-parallel-size 2 \
        --expert-model-parallel-size 2 --world-size 4
    # re-layout a sharded checkpoint's model offline (training loads any layout online anyway); the
    # output keeps the source's iteration and data position: continue with --no-load-optim (or --finetune)
    python tools/convert_checkpoint.py reshard runs/tiny/ckpt runs/tiny-ep4 --expert-model-parallel-size 4 --world-size 4
    # average checkpoints of one model into an HF folder: the newest 3 of a --save folder, or those
    # given (iteration folders), optionally weighted; the to-hf tokenizer flags apply
    python tools/convert_checkpoint.py average runs/tiny/ckpt hf/tiny-avg3 --last 3
    python tools/convert_checkpoint.py average runs/tiny/ckpt/iter_0000200 runs/tiny/ckpt/iter_0000300 hf/avg \
        --weights 1 2

to-hf writes the files `transformers.AutoTokenizer.from_pretrained(hf/tiny)` loads, giving
the same ids as training (HuggingFaceTokenizer, GPT2BPETokenizer, TikTokenizer, and GPTSentencePieceTokenizer
and Llama2Tokenizer with a BPE model with byte fallback, as tools/train_tokenizer.py trains or Llama's; what
has no exact Hugging Face form is refused, with the reason, before the checkpoint is read:
megatron_zaya/checkpoint/hf_tokenizer.py), and the tokenizer's EOS/BOS/pad ids to config.json. The
tokenizer is the one the tokenizer flags name, else the one the training run recorded in the checkpoint
(relative paths found from that run's directory or from here, the run's file where both hold one; stderr
says which, or why none is written); --no-tokenizer writes none.

Every conversion writes atomically (a temporary folder renamed at the end) and refuses to overwrite:
to-hf and average need a new or empty output folder (average also checks that every checkpoint holds the
same model config), from-hf and reshard one without checkpoints (and without a
latest_checkpointed_iteration.txt); the output, and the layout from the source's config, are checked before any
weight is read. Sharded outputs hold model weights only (no optimizer state).
Progress lines (weights read, ranks written) go to stderr unless --no-progress.
Exit status 0 on success, 1 on a checkpoint problem (the message names the file), 2 on usage errors (an output
that exists included), 130 when
interrupted (Ctrl-C or SIGTERM: the temporary folder is removed; after a SIGKILL, e.g. the OOM killer, the next
conversion to the same output removes it).
"""
from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from megatron_zaya.checkpoint import CheckpointError  # noqa: E402
from megatron_zaya.checkpoint.averaging import average_to_hf, checkpoints_to_average  # noqa: E402
from megatron_zaya.checkpoint.convert import (ConversionProgress, checkpoint_to_hf, hf_to_checkpoint,  # noqa: E402
                                              reshard_checkpoint)
from megatron_zaya.checkpoint.format import read_folder_metadata  # noqa: E402
from megatron_zaya.checkpoint.hf_format import DEFAULT_MAX_SHARD_BYTES, is_hf_folder  # noqa: E402
from megatron_zaya.checkpoint.inspection import resolve_folder  # noqa: E402
from megatron_zaya.checkpoint.hf_tokenizer import check_exportable  # noqa: E402
from megatron_zaya.checkpoint.preflight import latest_iteration_folder  # noqa: E402
from megatron_zaya.checkpoint.recorded_tokenizer import adopt_recorded_tokenizer  # noqa: E402
from megatron_zaya.data.tokenizer import (  # noqa: E402
    add_tiktoken_arguments, build_tokenizer, tiktoken_options, tokenizer_flags)
from megatron_zaya.errors import UserInputError  # noqa: E402
from megatron_zaya.interrupts import interrupt_on_sigterm  # noqa: E402
from megatron_zaya.paths import DanglingLink, nearest_existing  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SIZE_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30}


def shard_size(text: str) -> int:
    """--max-shard-size: bytes, or a number with KB/MB/GB (powers of 10, as transformers) or KiB/MiB/GiB."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else None
    if unit not in SIZE_UNITS or float(match.group(1)) * SIZE_UNITS[unit] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a size such as 5GB, 500MB or 2GiB")
    return int(float(match.group(1)) * SIZE_UNITS[unit])


def export_tokenizer(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """The tokenizer to-hf / average write beside the model, built and checked before the checkpoint is
    read: the tokenizer flags' (a bad flag or file exits with status 2), else the one the training run
    recorded in the checkpoint (a note on stderr says which, or why none is written), else None."""
    given = [flag for flag in tokenizer_flags(args) if flag != "--tokenizer-type"]
    recorded = None
    if args.tokenizer_type is None:
        if given:
            parser.error(f"{given[0]} needs --tokenizer-type")
        if args.no_tokenizer:
            return None
        source = args.checkpoint if args.command == "to-hf" else args.sources[-1]
        read_folder_metadata(resolve_folder(source))     # a missing or damaged checkpoint: its error, not a note
        recorded, why = adopt_recorded_tokenizer(args, source)
        if recorded is None:
            why = why or "it records no training run's text tokenizer"
            print(f"convert_checkpoint.py: note: no tokenizer files written ({source}: {why}); give the tokenizer "
                  f"flags to add them", file=sys.stderr)
            return None
    elif args.no_tokenizer:
        parser.error(f"--no-tokenizer and --tokenizer-type {args.tokenizer_type}: give one of them")
    try:
        check_exportable(args.tokenizer_type)
        tokenizer = build_tokenizer(args.tokenizer_type, args.tokenizer_model, vocab_file=args.vocab_file,
                                    merge_file=args.merge_file, **tiktoken_options(args))
        check_exportable(args.tokenizer_type, tokenizer)     # e.g. a SentencePiece model's own settings
    except UserInputError as err:
        if recorded is None:
            parser.error(str(err))
        print(f"convert_checkpoint.py: note: no tokenizer files written (the training run's {recorded.command_line()}: "
              f"{err})", file=sys.stderr)
        return None
    if recorded is not None:
        print(f"tokenizer: {recorded.command_line()}, as the training run that saved the checkpoint (the tokenizer "
              f"flags override it; --no-tokenizer leaves it out)", file=sys.stderr)
    return tokenizer


def check_source_kind(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A Hugging Face folder where a training checkpoint is read, or the other way round, or an output that
    is a file: a usage error naming the subcommand that converts what was given, or the file."""
    sources = [args.checkpoint] if args.command == "to-hf" else args.sources if args.command == "average" else []
    for source in sources:
        if is_hf_folder(source):
            parser.error(f"{source}: already a Hugging Face folder ({args.command} reads training checkpoints; "
                         f"from-hf converts a Hugging Face folder into one)")
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        parser.error(f"{args.output}: a file, not a folder ({args.command} writes a new or empty folder)")
    try:
        nearest_existing(args.output)
    except DanglingLink as err:      # (no folder can be made through it)
        parser.error(f"{args.output}: {err}")
    if args.command in ("from-hf", "reshard"):
        if os.path.isdir(args.output) and is_hf_folder(args.output):
            parser.error(f"{args.output}: a Hugging Face folder ({args.command} writes a training checkpoint into a "
                         f"new or empty folder; one inside an HF folder cannot be --load-ed from it)")
        hf = is_hf_folder(args.source)
        if args.command == "from-hf" and not hf and os.path.isdir(args.source) and latest_iteration_folder(args.source):
            parser.error(f"{args.source}: a training checkpoint, not a Hugging Face folder (to-hf exports it; "
                         f"reshard changes its layout)")
        if args.command == "reshard" and hf:
            parser.error(f"{args.source}: a Hugging Face folder (from-hf converts it into a training checkpoint "
                         f"of any layout)")


def main(argv=None) -> int:
    return interrupt_on_sigterm(_main, argv, "convert_checkpoint.py")   # a killed job removes its temporary files too


def _main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    to_hf = sub.add_parser("to-hf", help="sharded checkpoint -> Hugging Face folder")
    to_hf.add_argument("checkpoint")
    to_hf.add_argument("output")
    average = sub.add_parser("average", help="checkpoints of one model -> the HF folder of their (weighted) mean")
    average.add_argument("sources", nargs="+", help="checkpoint folders (iter_NNNNNNN or --save folders); with "
                                                     "--last, one --save folder")
    average.add_argument("output")
    average.add_argument("--last", type=int, default=None, help="the newest N complete checkpoints of the --save folder")
    average.add_argument("--weights", type=float, nargs="+", default=None,
                         help="one weight per checkpoint, oldest first (normalised; default: equal)")
    for p in (to_hf, average):
        p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                       help="default: as saved (to-hf), fp32 (average)")
        p.add_argument("--max-shard-size", type=shard_size, default=DEFAULT_MAX_SHARD_BYTES, metavar="SIZE",
                       help="a model larger than this (default 5GB) is written in shards of at most this size, "
                            "model-0000i-of-0000N.safetensors with model.safetensors.index.json, as transformers' "
                            "save_pretrained does"),
        p.add_argument("--tokenizer-type", default=None,
                       help="also write this tokenizer's Hugging Face files (default: the tokenizer the training "
                            "run recorded in the checkpoint, if its files are found)")
        p.add_argument("--no-tokenizer", action="store_true", help="write no tokenizer files")
        p.add_argument("--tokenizer-model", default=None)
        p.add_argument("--vocab-file", default=None, help="GPT2BPETokenizer: GPT-2's vocab.json")
        p.add_argument("--merge-file", default=None, help="GPT2BPETokenizer: GPT-2's merges.txt")
        add_tiktoken_arguments(p)
    for name in ("from-hf", "reshard"):
        p = sub.add_parser(name, help="HF folder -> sharded checkpoint" if name == "from-hf"
                           else "sharded checkpoint -> sharded checkpoint of another layout (model only)")
        p.add_argument("source")
        p.add_argument("output", help="a --save folder (iter_NNNNNNN and latest_checkpointed_iteration.txt go in it)")
        p.add_argument("--tensor-model-parallel-size", type=int, default=1)
        p.add_argument("--context-parallel-size", type=int, default=1)
        p.add_argument("--expert-model-parallel-size", type=int, default=1)
        p.add_argument("--world-size", type=int, default=None, help="default: TP x CP (data parallel 1)")
        p.add_argument("--iteration", type=int, default=None,
                       help="default: 0 (from-hf) or the source's (reshard, keeping its data position; another "
                            "value relabels the output as a fresh start at that iteration)")
    for p in sub.choices.values():
        p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    check_source_kind(parser, args)
    progress = None if args.no_progress else ConversionProgress()
    try:
        if args.command == "to-hf":
            tokenizer = export_tokenizer(parser, args)
            info = checkpoint_to_hf(args.checkpoint, args.output, DTYPES.get(args.dtype), tokenizer, progress,
                                    args.max_shard_size)
            print(f"wrote {args.output} from {info['folder']} (iteration {info['iteration']}, "
                  f"{info['tokens_seen']} tokens seen)")
            return 0
        if args.command == "average":
            tokenizer = export_tokenizer(parser, args)
            folders = checkpoints_to_average(args.sources, args.last)
            done = average_to_hf(folders, args.output, args.weights, DTYPES.get(args.dtype), tokenizer, progress,
                                 args.max_shard_size)
            print(f"wrote {args.output}: the mean of iterations {', '.join(map(str, done['iterations']))} with "
                  f"weights {', '.join(f'{w:.4g}' for w in done['weights'])}")
            return 0
        layout = dict(tp=args.tensor_model_parallel_size, cp=args.context_parallel_size,
                      ep=args.expert_model_parallel_size, world_size=args.world_size)
        if args.command == "from-hf":
            folder = hf_to_checkpoint(args.source, args.output, iteration=args.iteration or 0, progress=progress,
                                      **layout)
        else:
            folder = reshard_checkpoint(args.source, args.output, iteration=args.iteration, progress=progress,
                                        **layout)
        print(f"wrote {folder}")
        return 0
    except (UserInputError, FileExistsError) as err:    # a flag's value (--weights, --last, a layout, --iteration)
        print(f"convert_checkpoint.py: error: {err}", file=sys.stderr)   # or an output that exists: a usage error
        return 2
    except (CheckpointError, FileNotFoundError, ValueError) as err:
        print(f"convert_checkpoint.py: error: {err}", file=sys.stderr)
        return 1
    except OSError as err:           # a full disk, a folder not writable (the partial output is removed)
        print(f"convert_checkpoint.py: error: {args.output}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
