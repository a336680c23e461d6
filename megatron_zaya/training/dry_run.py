"""--dry-run: every check a run makes before its first step, and its start-up summary, without a model.

After the flags (arguments.validate: the layout against WORLD_SIZE), the tokenizer, the datasets' token
ids and tokenizer records and the --load / --save checks (setup._build_and_train), it prints the summary
(training/run_summary.py, data/blend_report.py), then builds the data pipeline's indices as data-parallel
rank 0 would (an empty split fails here; the indices are cached, so the real run starts faster) and
returns 0. A run that resumes a checkpoint is summed up from there: its position, its data phase (a new one's
line), the iterations left and the indices the job will read. No process group, model or optimizer is made.
"""
from __future__ import annotations

from megatron_zaya.data import build_train_valid_test_loaders
from megatron_zaya.training.batch_schedule import run_length
from megatron_zaya.training.data_phase import (data_signature, enter_run_data_phase, plan_train_blocks,
                                                train_data_position)
from megatron_zaya.training.run_summary import job_end_lines, startup_lines
from megatron_zaya.training.train_state import TrainState


def dry_run(run, tokenizer, datasets, print_line, loads_weights: bool, start=None) -> int:
    """`loads_weights`: check_before_build found the checkpoint the run would start from; `start`: that
    checkpoint (preflight.find_start), or None."""
    train, seq = run.train, run.model.seq_length
    dp = run.parallel.data_parallel_size
    for warning in run.warnings:
        print_line(f"WARNING {warning}")
    if train.load and not loads_weights:        # (a typo'd --load: the run would start from scratch)
        print_line(f"WARNING --load {train.load}: no checkpoint found; the run would train from scratch")
    state = resumed_state(run, start, print_line)
    schedule, total_iters = run_length(train, dp, state.iteration, state.consumed_samples)
    consumed, train_samples = train_data_position(state, schedule, total_iters)
    valid_samples = train.eval_iters * train.global_batch_size if train.eval_iters else 0
    # the summary first: it explains a failed build
    for line in startup_lines(run, tokenizer.vocab_size, datasets, train_samples) + \
            job_end_lines(run, state, schedule, total_iters):
        print_line(line)
    blocks, starts, kept = plan_train_blocks(run, state, train_samples, datasets)
    build_train_valid_test_loaders(run.data, train.global_batch_size, train.micro_batch_size, seq, 0, dp,
                                   consumed_samples=consumed, train_samples=blocks, valid_samples=valid_samples,
                                   test_samples=valid_samples, tokenizer=tokenizer, datasets=datasets,
                                   train_start=starts, train_kept=kept)
    left = max(0, total_iters - state.iteration)
    print_line(f"dry run: every check passed for {run.parallel.world_size} process"
               f"{'es' * (run.parallel.world_size > 1)} and {left:,} iterations"
               f"{f' (from iteration {state.iteration:,})' if state.iteration else ''}; no model was built, nothing "
               f"was trained or saved (drop --dry-run to train)")
    return 0


def resumed_state(run, start, print_line) -> TrainState:
    """The train state the run continues from: `start`'s (preflight.find_start: the checkpoint its load takes,
    and the ones it passes over), entered into this run's data phase (the phase line the run prints); a fresh
    one without a checkpoint to continue, or for a fine-tune."""
    from megatron_zaya.checkpoint.training import restore_train_state
    if start is None or start.train_cfg.finetune:
        return TrainState(data_signature=data_signature(run))
    for problem in start.passed_over:
        print_line(f"WARNING: the run would pass over an unusable checkpoint: {problem}")
    state = restore_train_state(TrainState, start.meta)
    print_line(f"resumes from {start.folder} (iteration {state.iteration:,}, consumed samples "
               f"{state.consumed_samples:,})")
    note = enter_run_data_phase(state, run)
    if note:
        print_line(note)
    return state
