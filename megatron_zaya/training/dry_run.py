"""--dry-run: every check a run makes before its first step, and its start-up summary, without a model.

After the flags (arguments.validate: the layout against WORLD_SIZE), the tokenizer, the datasets' token
ids and tokenizer records and the --load / --save checks (setup._build_and_train), it prints the summary
(training/run_summary.py, data/blend_report.py), then builds the data pipeline's indices as data-parallel
rank 0 would (an empty split fails here; the indices are cached, so the real run starts faster) and
returns 0. No process group, model or optimizer is made.
"""
from __future__ import annotations

from megatron_zaya.data import build_train_valid_test_loaders
from megatron_zaya.training.batch_schedule import run_length
from megatron_zaya.training.run_summary import startup_lines


def dry_run(run, tokenizer, datasets, print_line, loads_weights: bool) -> int:
    """`loads_weights`: check_before_build found the checkpoint the run would start from."""
    train, seq = run.train, run.model.seq_length
    dp = run.parallel.data_parallel_size
    schedule, total_iters = run_length(train, dp)
    run_samples = schedule.samples_consumed(0, total_iters)
    valid_samples = train.eval_iters * train.global_batch_size if train.eval_iters else 0
    for warning in run.warnings:
        print_line(f"WARNING {warning}")
    if train.load and not loads_weights:        # (a typo'd --load: the run would start from scratch)
        print_line(f"WARNING --load {train.load}: no checkpoint found; the run would train from scratch")
    for line in startup_lines(run, tokenizer.vocab_size, datasets, run_samples):   # first: they explain a failed build
        print_line(line)
    build_train_valid_test_loaders(run.data, train.global_batch_size, train.micro_batch_size, seq, 0, dp,
                                   consumed_samples=0, train_samples=run_samples, valid_samples=valid_samples,
                                   test_samples=valid_samples, tokenizer=tokenizer, datasets=datasets)
    print_line(f"dry run: every check passed for {run.parallel.world_size} process"
               f"{'es' * (run.parallel.world_size > 1)} and {total_iters:,} iterations; no model was built, nothing "
               f"was trained or saved (drop --dry-run to train)")
    return 0
