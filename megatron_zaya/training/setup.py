"""Build everything a run needs from a validated RunConfig, then train.

Order: tokenizer (and the padded vocabulary) -> the --save folder's lock (checkpoint.save_lock, held to
the end) -> checks of --save / --load (checkpoint.preflight) -> process layout -> model -> parallel
form -> optimizer -> checkpoint load -> data loaders -> trainer. Validation of the flags already happened
in megatron_zaya.arguments, before any of this."""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import time

import torch

from megatron_zaya.checkpoint.preflight import check_before_build, find_start
from megatron_zaya.checkpoint.save_lock import SaveFolderLock
from megatron_zaya.data import build_tokenizer, build_train_valid_test_loaders
from megatron_zaya.data.dataset_tokenizer import check_dataset_tokenizers
from megatron_zaya.data.loaders import (check_token_ids, missing_eod_warnings, open_datasets,
                                        unread_dataset_warnings)
from megatron_zaya.data.split_checks import check_splits_before_build, evaluation_warnings
from megatron_zaya.data.tokenizer import flags_text, tokenizer_flags
from megatron_zaya.kernels.capability import slow_bf16_warning
from megatron_zaya.model import ZayaModel
from megatron_zaya.model_vocab import vocab_from_tokenizer
from megatron_zaya.training.batch_schedule import run_length
from megatron_zaya.training.cpu_allocator import keep_freed_memory
from megatron_zaya.training.data_phase import (data_signature, plan_train_blocks, record_index_sizes,
                                                train_data_position)
from megatron_zaya.training.dry_run import dry_run
from megatron_zaya.training.logger import TrainingLogger
from megatron_zaya.training.loop import Trainer, TrainState
from megatron_zaya.training.runtime import SingleProcess
from megatron_zaya.training.run_summary import job_end_lines, startup_lines


def resolve_vocab(run, tokenizer) -> None:
    """The model's vocabulary is the tokenizer's, padded to a multiple of --make-vocab-size-divisible-by that
    --tensor-model-parallel-size divides (tokenizer_base.pad_vocab_size), or --vocab-size when given
    (model_vocab.vocab_from_tokenizer, which the tools counting parameters use too)."""
    run.model = vocab_from_tokenizer(run.model, run.args.vocab_size, tokenizer, run.data.tokenizer_model)


def build_runtime(run):
    """SingleProcess for one process, else DistributedRuntime; also for one process with
    --use-distributed-optimizer (Megatron's distributed optimizer at DP 1, on a one-rank group: with
    --bf16 the weights are bf16 and their fp32 masters live in the optimizer, as on more ranks). On
    CPU, freed memory is then kept in the process (cpu_allocator), so each step does not fault its
    tensors' pages in again, and --bf16 on a CPU without native bf16 matmuls is warned about (once, by
    the main rank)."""
    if run.parallel.world_size == 1 and not run.parallel.use_distributed_optimizer:
        runtime = SingleProcess()
    else:
        from megatron_zaya.training.distributed_runtime import DistributedRuntime
        runtime = DistributedRuntime(run)
    if runtime.is_main:
        for warning in getattr(run, "warnings", ()):   # from the flags (arguments.validate)
            print(f"WARNING {warning}", file=sys.stderr, flush=True)
    if runtime.device.type == "cpu":
        keep_freed_memory()
        warning = slow_bf16_warning(runtime.device) if run.train.bf16 else None
        if warning and runtime.is_main:
            print(f"WARNING {warning}", file=sys.stderr, flush=True)
    return runtime


def seed_everything(seed: int) -> None:
    """--seed for Python's, numpy's and torch's global generators, as Megatron-LM seeds them (numpy's was left
    to the OS, so the RNG state a checkpoint saves differed between two identical runs)."""
    import random

    import numpy as np
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_model(run, initialize: bool = True) -> ZayaModel:
    """The single-device model, identical on every rank (seeded), with its memory policy:
    --recompute-granularity full|selective and --recompute-modules (ZayaModel.set_recompute).
    `initialize=False` (a checkpoint's weights will be loaded, every tensor of them): built on the meta
    device, no tensor allocated nor initialised (ZAYA1-base: about a minute of random numbers per rank at
    every restart, and 35 GB of host memory per rank); the runtime's prepare_model allocates this rank's
    slices on its device (runtime.place_on)."""
    torch.manual_seed(run.train.seed)
    if initialize:
        model = ZayaModel(run.model)
    else:
        with torch.device("meta"):
            model = ZayaModel(run.model)
    train = run.train
    model.set_recompute(train.recompute_granularity, train.recompute_method, train.recompute_num_layers,
                        train.recompute_modules)
    model.set_force_load_balancing(run.train.moe_router_force_load_balancing)
    return model


def final_evaluation(run, trainer, logger, force: bool = False) -> None:
    """Validate at the last iteration (unless the loop just did, and not `force`) and print the result.
    A run resumed at its last iteration trains nothing and validates here."""
    evaluated_last = run.train.eval_interval and trainer.state.iteration % run.train.eval_interval == 0
    reuse = evaluated_last and not force and trainer.last_validation is not None
    final = trainer.last_validation if reuse else trainer.run_evaluation()
    if final:
        logger.print(f"final validation loss {final['validation loss']:.4f} "
                     f"(perplexity {final['validation ppl']:.2f}) at iteration {trainer.state.iteration}")


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool):
    """--deterministic-mode: torch's deterministic kernels everywhere (cuBLAS needs its workspace
    setting before the first matmul; cuDNN its flags), for the run; the settings before it come back
    afterwards (a run inside a longer process, e.g. a test)."""
    if not enabled:
        yield
        return
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1], before[2]


def build_and_train(run) -> int:
    with deterministic_algorithms(run.train.deterministic_mode):
        return _build_and_train(run)


def _build_and_train(run) -> int:
    started = time.time()        # --exit-duration-in-mins counts the start-up too, as Megatron-LM's does
    if getattr(run.args, "logging_level", None) is not None:      # --logging-level
        logging.getLogger().setLevel(run.args.logging_level)
    if getattr(run.args, "disable_bf16_reduced_precision_matmul", False):
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    tokenizer = build_tokenizer(run.data.tokenizer_type, run.data.tokenizer_model,
                                run.model.make_vocab_size_divisible_by, run.parallel.tensor_model_parallel_size,
                                **run.data.tokenizer_kwargs())
    resolve_vocab(run, tokenizer)
    datasets = open_datasets(run.data)
    check_dataset_tokenizers(datasets, tokenizer, flags_text(tokenizer_flags(run.data)))   # its record says another
    check_token_ids(run.data, tokenizer.vocab_size, datasets=datasets)   # a dataset of another tokenizer
    run.warnings += missing_eod_warnings(run.data, tokenizer.eod, datasets=datasets)   # printed by the main rank
    run.warnings += unread_dataset_warnings(run.data, run.model.seq_length, datasets)
    check_splits_before_build(run.data, datasets, run.model.seq_length, trains=not run.train.skip_train,
                              evaluates=run.train.eval_iters > 0)      # an empty split: now, not after the model
    run.warnings += evaluation_warnings(run.data, run.train.eval_iters)
    from megatron_zaya.parallel.launch import detect_launcher
    first_process = detect_launcher().rank == 0
    # Another run saving into --save: stop now (a dry run only looks)
    save_lock = SaveFolderLock.hold(run.train.save, first_process, create=not run.train.dry_run)
    try:
        found = find_start(run.train)
        loads_weights = check_before_build(run, found)    # --save / --load problems: before process groups, model
        if run.train.dry_run:
            return dry_run(run, tokenizer, datasets, lambda line: first_process and print(line, flush=True),
                           loads_weights, found[0])
        return _train(run, tokenizer, datasets, loads_weights, started)
    finally:
        save_lock.release()


def _ready_trainer(run, trainer, tokenizer, datasets, loads_weights: bool):
    """The TrainingLogger of a run, `trainer` readied: the checkpoint loaded, the logger opened and the
    start-up lines printed (before the data indices are built, which can take minutes), the data loaders
    built from its position."""
    runtime, checkpointer = trainer.parallel, trainer.checkpointer
    if run.train.load or run.train.pretrained_checkpoint:
        checkpointer.load(trainer, required=loads_weights)
        trainer.batch_schedule, trainer.total_iters = run_length(run.train, runtime.dp_size, trainer.state.iteration,
                                                                 trainer.state.consumed_samples)

    seq = run.model.seq_length
    gbs = run.train.global_batch_size
    # Sized from the schedule (never the raw --train-samples: a partial last batch is not trained on).
    consumed, train_samples = train_data_position(trainer.state, trainer.batch_schedule, trainer.total_iters)
    consumed_now = trainer.state.consumed_samples      # the bar's total: these plus the samples still to come
    ramp_samples = consumed_now + trainer.batch_schedule.samples_consumed(
        consumed_now, max(0, trainer.total_iters - trainer.state.iteration)) if run.train.rampup_batch_size else None
    trains = not run.train.skip_train and trainer.state.iteration < trainer.total_iters
    logger = trainer.logger = TrainingLogger(runtime.is_main, run.train.tensorboard_dir, trainer.total_iters,
                                             trainer.state.iteration, run.train.progress_bar,
                                             run.train.tensorboard_queue_size, trainer.state.consumed_samples,
                                             total_samples=ramp_samples, purge=trains)
    checkpointer.console = logger.print
    # the data's samples: those of this data phase read so far (at the batch sizes of the jobs before) and
    # those to come, as the loader reads them (a resume on new data starts a phase: docs/DATA.md)
    for line in (startup_lines(run, tokenizer.vocab_size, datasets, train_samples)
                 + job_end_lines(run, trainer.state, trainer.batch_schedule, trainer.total_iters)):
        logger.print(line)
    valid_samples = run.train.eval_iters * gbs if run.train.eval_iters else 0
    # the phase's dataset as the jobs before this one sized it, grown or extended for this one's samples;
    # each dataset read after the samples the run's earlier data phases read of it, its index built alike
    blocks, starts, kept = plan_train_blocks(run, trainer.state, train_samples, datasets)
    trainer.state.data_blocks = blocks
    train_loader, valid_loaders, test_loader = build_train_valid_test_loaders(
        run.data, gbs, run.train.micro_batch_size, seq, runtime.dp_rank, runtime.dp_size,
        consumed_samples=consumed, train_samples=blocks,
        valid_samples=valid_samples, test_samples=valid_samples, tokenizer=tokenizer, datasets=datasets,
        train_start=starts, train_kept=kept)
    record_index_sizes(run.data, trainer.state, seq, blocks, datasets, starts, kept)
    trainer.train_iterator = iter(train_loader if train_loader is not None else ())   # None: nothing left
    # Validation always reads the same samples of each set, so successive values compare.
    trainer.valid_loaders = valid_loaders
    trainer.test_loader = test_loader        # a split with a share in --split (or --test-data-path)
    return logger


def _train(run, tokenizer, datasets, loads_weights: bool, started: float) -> int:
    runtime = build_runtime(run)
    model = build_model(run, initialize=not loads_weights)
    model = runtime.prepare_model(model)
    optimizer = runtime.build_optimizer(model, run.optim)

    state = TrainState(data_signature=data_signature(run))
    # Always built: it also owns the SIGTERM/SIGUSR1 handlers and the watchdog.
    from megatron_zaya.checkpoint.training import TrainingCheckpointer
    checkpointer = TrainingCheckpointer(run, runtime)

    trainer = Trainer(run, model, optimizer, runtime, None, None, None, checkpointer, state)
    trainer.run_started = started
    try:
        logger = _ready_trainer(run, trainer, tokenizer, datasets, loads_weights)
    except BaseException:     # a failure before the loop: the signal handlers and the watchdog end with it
        checkpointer.close()
        if trainer.logger is not None:
            trainer.logger.close()
        raise
    del datasets
    try:
        if run.train.skip_train:         # Megatron-LM's --skip-train: evaluate the loaded model, save nothing
            logger.print(f"--skip-train: evaluating the model of iteration {trainer.state.iteration} only")
            final_evaluation(run, trainer, logger, force=True)
            trainer.run_test_evaluation()
            if trainer.evaluation_interrupted:      # an evaluation-only job cut short did not do its work
                runtime.barrier()
                return 130
        else:
            trainer.train()
            # The last checkpoint first, as Megatron-LM saves it: a signal or time limit during a long final
            # evaluation costs no training.
            checkpointer.finalize(trainer)
            if trainer.exit_reason:   # preemption or an exit flag: no evaluation to wait for
                logger.print(f"skipping the final evaluation ({trainer.exit_reason})")   # (Megatron-LM exits too)
            else:
                final_evaluation(run, trainer, logger)
                trainer.run_test_evaluation()
        runtime.barrier()     # every rank done with its collectives before any tears its groups down
    finally:
        checkpointer.close()
        logger.close()
        if hasattr(runtime, "shutdown"):
            runtime.shutdown()
    return 0

