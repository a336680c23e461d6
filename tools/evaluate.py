"""Held-out loss, perplexity and per-expert routing statistics of a checkpoint on a validation split.

    python tools/evaluate.py --load CKPT --data-path data/web_text_document \\
        --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model tok.model \\
        --split 969,30,1 --seq-length 1024 --micro-batch-size 4 [--eval-iters 50] \\
        [--tensorboard-dir runs/eval] [--output-json eval.json]

CKPT is a Hugging Face ZAYA folder or a megatron-zaya checkpoint (megatron_zaya/inference/loading.py);
without tokenizer flags the folder's own tokenizer.json, or the tokenizer flags the training run recorded in
the checkpoint, are used.
The samples are the data pipeline's own validation samples (megatron_zaya.data: same --data-path
blend, --split, --seed, index cache and masks as training), read in order; --eval-iters N reads N global
batches (--global-batch-size, default --micro-batch-size), as training counts them, so the training run's
flags give the validation loss it logged. Without --eval-iters the
whole validation split is read once (about one pass: (tokens - 1) // seq_length samples per
dataset). --split-name test evaluates the test split instead; --per-dataset evaluates each dataset
of the blend on its own (a summary table of loss and perplexity per dataset). Prints the loss/perplexity and a table
of routing statistics per layer (load per expert, load entropy, max load, skip rate, router entropy;
see megatron_zaya/inference/evaluation.py); --tensorboard-dir also writes them as scalars at
--step (default: the checkpoint's iteration, else 0). Progress goes to stderr every --log-interval
micro-batches (default: about ten lines per run; 0: none).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from megatron_zaya.config import ConfigError  # noqa: E402
from megatron_zaya.data.blend import parse_data_path  # noqa: E402
from megatron_zaya.data.dataset_tokenizer import check_dataset_tokenizers  # noqa: E402
from megatron_zaya.data.indexed import strip_suffix  # noqa: E402
from megatron_zaya.data.tokenizer import (  # noqa: E402
    flags_text, null_tokenizer_size_from_vocab_size, tiktoken_options, tokenizer_flags)
from megatron_zaya.errors import UserInputError  # noqa: E402
from megatron_zaya.interrupts import say  # noqa: E402
from megatron_zaya.inference.cli_checks import (  # noqa: E402
    OWN_TOKENIZER, add_tokenizer_arguments, check_device, check_threads, check_tokenizer_fits, check_writable_output,
    peek_model_config, tokenizer_from_flags, tokenizer_of_checkpoint, write_output_json)
from megatron_zaya.inference.evaluation import evaluate, format_table, write_tensorboard  # noqa: E402
from megatron_zaya.inference.loading import DTYPES, load_model_for_inference, parse_dtype  # noqa: E402

SPLITS = {"valid": 1, "test": 2}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load", required=True, help="checkpoint: HF ZAYA folder or megatron-zaya checkpoint")
    p.add_argument("--data-path", nargs="+", required=True, help="Megatron blend: [weight] prefix ...")
    p.add_argument("--split", default="969,30,1", help="train,valid,test shares (as in training)")
    p.add_argument("--split-name", default="valid", choices=sorted(SPLITS))
    p.add_argument("--per-dataset", action="store_true",
                   help="evaluate each dataset of --data-path alone (weights ignored): a table per dataset, "
                        "TensorBoard SPLIT/NAME/*, JSON 'datasets' (as training's --multiple-validation-sets)")
    add_tokenizer_arguments(p)     # required, unless --load brings its own tokenizer (cli_checks.OWN_TOKENIZER)
    p.add_argument("--seq-length", type=int, default=None, help="default: the checkpoint config's seq_length")
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--global-batch-size", type=int, default=None,
                   help="samples per --eval-iters iteration, as in training (default: --micro-batch-size)")
    p.add_argument("--eval-iters", type=int, default=None,
                   help="global batches to evaluate, as pretrain_zaya.py's --eval-iters counts them: the training "
                        "run's flags give its logged validation loss (default: one pass)")
    p.add_argument("--seed", type=int, default=1234, help="data shuffle seed (as in training)")
    p.add_argument("--data-cache-path", default=None)
    p.add_argument("--no-index-cache", action="store_true", help="build the sample indices in memory")
    p.add_argument("--eod-mask-loss", action="store_true")
    p.add_argument("--reset-position-ids", action="store_true")
    p.add_argument("--reset-attention-mask", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="cast parameters (default: as stored)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (0: torch's default)")
    p.add_argument("--log-interval", type=int, default=None,
                   help="print progress to stderr every N micro-batches (default: ~10 lines per run; 0: off)")
    p.add_argument("--tensorboard-dir", default=None)
    p.add_argument("--step", type=int, default=None, help="TensorBoard step (default: checkpoint iteration or 0)")
    p.add_argument("--output-json", default=None)
    return p


def check_eval_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The data and size flags, checked as pretrain_zaya.py checks them, before the checkpoint is
    loaded: the --data-path blend and each .bin/.idx header, the index cache's folders, --split, the
    tokenizer flags, sizes."""
    from megatron_zaya.arguments import check_data_path
    from megatron_zaya.data.index_builders import parse_split
    from megatron_zaya.data.tokenizer import check_tokenizer_flags
    from megatron_zaya.paths import check_index_cache_dirs

    for flag, value in (("--micro-batch-size", args.micro_batch_size), ("--eval-iters", args.eval_iters),
                        ("--seq-length", args.seq_length), ("--global-batch-size", args.global_batch_size)):
        if value is not None and value < 1:
            parser.error(f"{flag}={value} must be >= 1")
    if not 0 <= args.seed <= 2**32 - 1:       # the data's shuffle seed, as pretrain_zaya.py takes it
        parser.error(f"--seed={args.seed} must be in [0, 2**32 - 1]")
    if args.log_interval is not None and args.log_interval < 0:
        parser.error(f"--log-interval={args.log_interval} must be >= 0 (0: no progress lines)")
    try:
        prefixes = check_data_path(args.data_path)
        if not args.no_index_cache:     # the folders the indices are cached in: written once the model is loaded
            for warning in check_index_cache_dirs(prefixes, args.data_cache_path, "--no-index-cache"):
                print(f"evaluate.py: warning: {warning}", file=sys.stderr)
        shares = parse_split(args.split)
        null_tokenizer_size_from_vocab_size(args)       # Megatron's NullTokenizer --vocab-size N
        if not (tokenizer_flags(args) or tokenizer_of_checkpoint(args)):
            raise UserInputError(f"--tokenizer-type is required (the data's tokenizer), unless {OWN_TOKENIZER}")
        check_tokenizer_flags(args.tokenizer_type, args.tokenizer_model, args.vocab_file, args.merge_file,
                              **tiktoken_options(args))
        check_threads(args.threads)
        check_device(args.device)
        check_writable_output("--output-json", args.output_json, load=args.load)
        check_writable_output("--tensorboard-dir", args.tensorboard_dir, is_dir=True)
    except UserInputError as err:
        parser.error(str(err))
    if shares[SPLITS[args.split_name]] == 0:
        parser.error(f"--split {args.split}: the {args.split_name} split (--split-name) has a zero share; "
                     f"give it a share (train,valid,test) or choose another --split-name")


def one_pass_samples(data_path: list[str], split: str, split_id: int, seq_length: int) -> int:
    from megatron_zaya.data.gpt_dataset import split_indices
    from megatron_zaya.data.indexed import IndexedDataset

    total = 0
    for prefix in parse_data_path(data_path)[1]:
        indexed = IndexedDataset(prefix)
        idx = split_indices(indexed, split)[split_id]
        if idx is not None and len(idx):
            total += max(0, (indexed.tokens_in(idx.start, idx.stop) - 1) // seq_length)
    return total


def batches_of(dataset, num_samples: int, micro_batch_size: int):
    """Micro-batches of the first `num_samples` samples. A token id outside the tokenizer's vocabulary
    (which fits the checkpoint's embedding: check_tokenizer_fits) raises UserInputError naming the
    dataset as the sample is read (GPTDataset), instead of an embedding IndexError."""
    from megatron_zaya.data.loaders import collate

    for begin in range(0, num_samples, micro_batch_size):
        yield collate([dataset[i] for i in range(begin, min(begin + micro_batch_size, num_samples))])


def with_progress(batches, total: int, interval: int | None):
    """Yield `batches`, printing 'evaluated i/total micro-batches' to stderr every `interval` of them
    (None: about ten lines in all, none for under 20 batches; 0: never)."""
    if interval is None:
        interval = total // 10 if total >= 20 else 0
    start = time.perf_counter()
    for i, batch in enumerate(batches, 1):
        yield batch
        if interval and (i % interval == 0 or i == total):
            elapsed = time.perf_counter() - start
            eta = elapsed / i * (total - i)
            say(f"evaluated {i}/{total} micro-batches, {elapsed:.0f}s elapsed, ~{eta:.0f}s left", sys.stderr)


def count_samples(parser: argparse.ArgumentParser, args: argparse.Namespace, seq_length: int,
                  data_path: list[str] | None = None) -> int:
    """Samples to evaluate in `data_path` (default --data-path): one pass over the split, or --eval-iters
    global batches (--global-batch-size, default --micro-batch-size: Megatron-LM's count, so a training run's
    flags evaluate the samples its validation did); refuses a split without a single sample of --seq-length + 1
    tokens."""
    data_path = data_path or args.data_path
    available = one_pass_samples(data_path, args.split, SPLITS[args.split_name], seq_length)
    if available < 1:
        parser.error(f"--data-path {' '.join(data_path)} / --split {args.split}: the {args.split_name} split has "
                     f"fewer than --seq-length {seq_length} + 1 tokens")
    return available if args.eval_iters is None else args.eval_iters * (args.global_batch_size or args.micro_batch_size)


def datasets_to_evaluate(args) -> list[list[str]]:
    """The blends evaluated: --data-path as one, or each of its datasets alone (--per-dataset)."""
    if not args.per_dataset:
        return [args.data_path]
    # each dataset once, however it is spelled (P, P.bin, ./P: one dataset)
    return [[p] for p in dict.fromkeys(strip_suffix(p) for p in parse_data_path(args.data_path)[1])]


def check_seq_length(parser: argparse.ArgumentParser, args: argparse.Namespace, config) -> int:
    """--seq-length (default: the checkpoint's) as pretrain_zaya.py checks it against the config."""
    seq_length = args.seq_length or config.seq_length
    try:
        config.replace(seq_length=seq_length)      # the check pretrain_zaya.py makes (ModelConfig.validate)
    except ConfigError as err:
        parser.error(f"--seq-length={seq_length} does not fit the checkpoint {args.load}: {err}")
    return seq_length


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_eval_flags(parser, args)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        dtype = parse_dtype(args.dtype)
    except ValueError as err:
        parser.error(str(err))

    try:
        tokenizer = tokenizer_from_flags(args)
        check_dataset_tokenizers(parse_data_path(args.data_path)[1], tokenizer, flags_text(tokenizer_flags(args)))
    except UserInputError as err:
        parser.error(str(err))
    peeked = peek_model_config(args.load)       # config.json / metadata.json only: no tensor read yet
    if peeked is not None:
        for data_path in datasets_to_evaluate(args):
            count_samples(parser, args, check_seq_length(parser, args, peeked), data_path)
    try:
        model, config, info = load_model_for_inference(args.load, device=args.device, dtype=dtype)
    except (OSError, ValueError, RuntimeError) as err:
        parser.error(f"--load: {err}")
    try:
        check_tokenizer_fits(tokenizer, config, args)
    except UserInputError as err:
        parser.error(str(err))
    seq_length = check_seq_length(parser, args, config)
    step = args.step if args.step is not None else int(info.get("iteration") or 0)
    if not args.per_dataset:
        result, elapsed = evaluate_data(parser, args, args.data_path, model, config, tokenizer, seq_length)
        say(f"checkpoint {info.get('path', args.load)} [{info.get('format')}], {args.split_name} split of "
            f"{' '.join(args.data_path)}, seq_length {seq_length}, {elapsed:.1f}s")
        say(format_table(result))
        if args.tensorboard_dir:
            write_tensorboard(result, args.tensorboard_dir, step, prefix=args.split_name)
        report = result.as_dict()
    else:
        from megatron_zaya.data.validation import validation_set_names
        prefixes = [blend[0] for blend in datasets_to_evaluate(args)]
        results = {}
        for name, prefix in zip(validation_set_names(prefixes), prefixes):
            result, elapsed = evaluate_data(parser, args, [prefix], model, config, tokenizer, seq_length)
            results[name] = result
            say(f"=== {name}: {args.split_name} split of {prefix}, {result.samples} samples, {elapsed:.1f}s")
            say(format_table(result))
            if args.tensorboard_dir:
                write_tensorboard(result, args.tensorboard_dir, step, prefix=f"{args.split_name}/{name}")
        width = max(len(name) for name in results)
        say(f"checkpoint {info.get('path', args.load)} [{info.get('format')}], seq_length {seq_length}")
        say(f"{'dataset':<{width}}  {'samples':>8}  {'loss':>8}  {'ppl':>10}")
        for name, result in results.items():
            say(f"{name:<{width}}  {result.samples:>8}  {result.loss:>8.4f}  {result.perplexity:>10.3f}")
        report = {"datasets": {name: result.as_dict() for name, result in results.items()}}
    if args.output_json:
        try:
            write_output_json("--output-json", args.output_json, {"checkpoint": info, "split": args.split_name,
                                                                  "seq_length": seq_length, "step": step, **report})
        except UserInputError as err:
            parser.error(str(err))
    return 0


def evaluate_data(parser, args, data_path: list[str], model, config, tokenizer, seq_length: int):
    """(EvalResult, seconds) of the checkpoint on `data_path`'s --split-name split."""
    from megatron_zaya.data import DataConfig, build_train_valid_test_datasets

    split_id = SPLITS[args.split_name]
    num_samples = count_samples(parser, args, seq_length, data_path)
    data_config = DataConfig(data_path=data_path, split=args.split, data_cache_path=args.data_cache_path,
                             seed=args.seed, num_workers=0, reset_position_ids=args.reset_position_ids,
                             reset_attention_mask=args.reset_attention_mask, eod_mask_loss=args.eod_mask_loss,
                             tokenizer_type=args.tokenizer_type, tokenizer_model=args.tokenizer_model,
                             vocab_file=args.vocab_file, merge_file=args.merge_file, no_index_cache=args.no_index_cache,
                             **tiktoken_options(args))
    sizes = [0, 0, 0]
    sizes[split_id] = num_samples
    try:                # (a blend's small member with an empty split: named, before any batch runs)
        dataset = build_train_valid_test_datasets(data_config, seq_length, sizes, tokenizer)[split_id]
    except UserInputError as err:
        parser.error(str(err))
    num_samples = min(num_samples, len(dataset))
    start = time.perf_counter()
    batches = batches_of(dataset, num_samples, args.micro_batch_size)
    total = -(-num_samples // args.micro_batch_size)
    try:
        result = evaluate(model, with_progress(batches, total, args.log_interval))
    except UserInputError as err:
        parser.error(str(err))
    return result, time.perf_counter() - start

if __name__ == "__main__":
    sys.exit(main())
