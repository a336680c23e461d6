"""Megatron-named command-line flags (+ an optional YAML file) -> validated config objects.

Everything is checked here, before any process group, allocation or data loading: a bad value stops
the run with one line naming the flag. Flags given on the command line override `--config FILE.yaml`
(keys spelled like the flags, with dashes or underscores), which overrides the `--preset` model.
The parser and the YAML defaults are in flags.py; --load's checks in checkpoint/preflight.py.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass, field, fields

import torch

from megatron_zaya import kernels
from megatron_zaya.checkpoint.preflight import (check_load_path, checkpoint_args_source, checkpoint_at_step,
                                                model_config_from_checkpoint, tensor_parallel_from_checkpoint,
                                                tokenizer_args_from_checkpoint)
from megatron_zaya.config import ConfigError, ModelConfig, model_config_from_preset
from megatron_zaya.data.blend import parse_data_path
from megatron_zaya.data.index_builders import parse_split
from megatron_zaya.data.indexed import IndexedDatasetError, check_indexed_dataset
from megatron_zaya.data.tokenizer import check_tokenizer_flags, tiktoken_options
from megatron_zaya.errors import UserInputError
from megatron_zaya.flags import DEFAULT_PRESET, MODEL_FLAGS, apply_yaml_defaults, build_parser, let_the_command_line_win
from megatron_zaya.megatron_flags import (check_megatron_flags, check_moe_layer_freq, preset_shape_warning,
                                         resolve_aliases, typed_flag_message)
from megatron_zaya.model import recompute
from megatron_zaya.model_vocab import megatron_tokenizer_vocab_size, pad_placeholder_vocab
from megatron_zaya.optim.builder import OptimizerConfig
from megatron_zaya.parallel.data import DEFAULT_BUCKET_SIZE
from megatron_zaya.parallel.state import LayoutError, check_layout
from megatron_zaya.paths import check_creatable_dir, check_index_cache_dirs
from megatron_zaya.optim.schedules import (decoupled_lr_schedule, lr_schedule_from_flags,
                                          weight_decay_schedule_from_flags)
from megatron_zaya.training.batch_schedule import BatchSizeSchedule
from megatron_zaya.training.config import TrainConfig
from megatron_zaya.training.host_memory import check_host_memory, ranks_on_this_machine
from megatron_zaya.training.profiling import check_profile_flags

@dataclass
class ParallelSizes:
    world_size: int
    tensor_model_parallel_size: int = 1
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = False
    ddp_bucket_size: int = DEFAULT_BUCKET_SIZE
    ddp_num_buckets: int | None = None       # --ddp-num-buckets: the bucket size follows from the rank's gradients

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // (self.tensor_model_parallel_size * self.context_parallel_size)


@dataclass
class RunConfig:
    model: ModelConfig
    train: TrainConfig
    optim: OptimizerConfig
    parallel: ParallelSizes
    data: object            # megatron_zaya.data.DataConfig
    args: argparse.Namespace
    warnings: list[str] = field(default_factory=list)   # printed once by the main rank at start-up


def world_size_from_env(planning: bool = False) -> int:
    """The world size the launcher gives this process (parallel.launch.detect_launcher: torchrun's
    WORLD_SIZE, mpirun's, srun's); without a launcher, or when `planning` (--dry-run, which starts no
    process group: also inside an `srun --pty bash` step), WORLD_SIZE when set (a cluster's run planned on
    one machine: `WORLD_SIZE=1024 ... --dry-run`), else 1: an sbatch script or salloc shell with
    SLURM_NTASKS=8 runs ONE process (detect_launcher warns about it at start-up). A WORLD_SIZE that another
    launcher's count contradicts is refused: each rank would plan another layout than the one it runs in."""
    import warnings

    from megatron_zaya.parallel.launch import detect_launcher
    given = os.environ.get("WORLD_SIZE", "")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        info = detect_launcher() if not (planning and given) else None
    if info is None or info.launcher == "none":
        if not given:
            return 1
        try:
            size = int(given)
        except ValueError:
            raise UserInputError(f"WORLD_SIZE={given!r}: not a whole number") from None
        if size < 1:
            raise UserInputError(f"WORLD_SIZE={size}: must be at least 1")
        return size
    if given and given != str(info.world_size):
        raise UserInputError(f"WORLD_SIZE={given} in the environment, but {info.launcher} started {info.world_size} "
                             f"processes: unset WORLD_SIZE (it is for planning a run with --dry-run)")
    return info.world_size


def parse_args(argv=None) -> RunConfig:
    parser = build_parser()
    pre, _ = parser.parse_known_args(argv)
    if pre.config:
        apply_yaml_defaults(parser, pre.config)
    args = parser.parse_args(argv)
    if pre.config:
        let_the_command_line_win(args, argv)
    try:
        return validate(args)
    except (ConfigError, LayoutError, ValueError) as err:
        parser.error(typed_flag_message(str(err), args))


def _ge0(v) -> bool:
    return v >= 0


def _ge1(v) -> bool:
    return v >= 1


def _gt0(v) -> bool:
    return v > 0


def _unit(v) -> bool:
    return 0 <= v < 1


# Flags with an obvious domain: (dest, predicate, what it must be). Unset (None) flags are skipped;
# the predicates are written so that NaN fails them.
NUMBER_DOMAINS = (
    ("micro_batch_size", _ge1, "must be >= 1"), ("global_batch_size", _ge1, "must be >= 1"),
    ("train_iters", _ge1, "must be >= 1"), ("train_samples", _ge1, "must be >= 1"),
    ("log_interval", _ge1, "must be >= 1"), ("eval_interval", _ge1, "must be >= 1"),
    ("eval_iters", _ge0, "must be >= 0"), ("seed", lambda v: 0 <= v <= 2**32 - 1, "must be in [0, 2**32 - 1]"),
    ("lr", _ge0, "must be >= 0"), ("min_lr", _ge0, "must be >= 0"), ("decoupled_lr", _ge0, "must be >= 0"),
    ("decoupled_min_lr", _ge0, "must be >= 0"), ("lr_warmup_iters", _ge0, "must be >= 0"),
    ("lr_decay_iters", _ge1, "must be >= 1"), ("lr_wsd_decay_iters", _ge0, "must be >= 0"),
    ("lr_warmup_samples", _ge0, "must be >= 0"), ("lr_decay_samples", _ge1, "must be >= 1"),
    ("lr_wsd_decay_samples", _ge0, "must be >= 0"), ("lr_warmup_init", _ge0, "must be >= 0"),
    ("manual_gc_interval", _ge0, "must be >= 0"), ("distributed_timeout_minutes", _gt0, "must be > 0"),
    ("weight_decay", _ge0, "must be >= 0"), ("start_weight_decay", _ge0, "must be >= 0"),
    ("end_weight_decay", _ge0, "must be >= 0"), ("clip_grad", _ge0, "must be >= 0 (0 turns clipping off)"),
    ("adam_beta1", _unit, "must be in [0, 1)"), ("adam_beta2", _unit, "must be in [0, 1)"),
    ("adam_eps", _gt0, "must be > 0"), ("muon_momentum", _unit, "must be in [0, 1)"),
    ("muon_num_ns_steps", _ge1, "must be >= 1"), ("muon_extra_scale_factor", _gt0, "must be > 0"),
    ("moe_router_bias_lr", _ge0, "must be >= 0"), ("moe_router_bias_beta1", _unit, "must be in [0, 1)"),
    ("moe_router_bias_beta2", _unit, "must be in [0, 1)"), ("moe_router_bias_eps", _gt0, "must be > 0"),
    ("moe_router_skip_target", _unit, "must be in [0, 1)"), ("num_workers", _ge0, "must be >= 0"),
    ("save_interval", _ge1, "must be >= 1"), ("ckpt_keep", _ge1, "must be >= 1"),
    ("save_retain_interval", _ge1, "must be >= 1"),
    ("exit_interval", _ge1, "must be >= 1"), ("exit_duration_in_mins", _gt0, "must be > 0"),
    ("peak_tflops", _gt0, "must be > 0"), ("ddp_bucket_size", _ge1, "must be >= 1"),
    ("ddp_num_buckets", _ge1, "must be >= 1"),
    ("tensorboard_log_interval", _ge1, "must be >= 1"), ("tensorboard_queue_size", _ge1, "must be >= 1"),
    ("recompute_num_layers", _ge1, "must be >= 1"), ("straggler_minmax_count", _ge1, "must be >= 1"),
    ("check_weight_hash_across_dp_replicas_interval", _ge1, "must be >= 1"),
    ("non_persistent_save_interval", _ge1, "must be >= 1"), ("mid_level_dataset_surplus", _ge0, "must be >= 0"),
    ("num_dataset_builder_threads", _ge1, "must be >= 1"),
    ("logging_level", _ge0, "must be >= 0 (e.g. 20 for INFO)"),
    ("max_consecutive_nonfinite", _ge1, "must be >= 1"), ("watchdog_timeout_factor", _gt0, "must be > 0"),
    ("watchdog_min_seconds", _gt0, "must be > 0"), ("watchdog_first_iteration_seconds", _gt0, "must be > 0"),
    ("watchdog_pause_seconds", _ge0, "must be >= 0 (0: no limit)"),
)


def check_number_domains(args: argparse.Namespace) -> None:
    """Range checks of the numeric flags (NUMBER_DOMAINS; infinity is in none of them: `--lr inf` passed
    `>= 0` and trained on non-finite weights); raises UserInputError naming the flag."""
    for dest, ok, domain in NUMBER_DOMAINS:
        value = getattr(args, dest, None)
        if value is None:
            continue
        if isinstance(value, float) and math.isinf(value):
            raise UserInputError(f"--{dest.replace('_', '-')}={value}: must be a finite number")
        if not ok(value):
            raise UserInputError(f"--{dest.replace('_', '-')}={value}: {domain}")


def check_data_path(data_path: list[str], flag: str = "--data-path") -> list[str]:
    """Parse a Megatron blend exactly as the data pipeline does and check the header of each
    `.bin`/`.idx` pair (a few bytes read, no index built); returns the prefixes."""
    prefixes = parse_data_path(data_path, flag)[1]
    for prefix in dict.fromkeys(prefixes):
        try:
            check_indexed_dataset(prefix)
        except IndexedDatasetError as err:
            raise UserInputError(f"{flag} {prefix}: {err}") from None
    return prefixes


def _check_sequence_splits(args: argparse.Namespace, model: ModelConfig) -> None:
    """Sequence-length rules of context and sequence parallelism, checked before any process group:
    CP cuts the sequence into 2 x CP chunks; SP splits each rank's chunk over TP."""
    tp, cp = args.tensor_model_parallel_size, args.context_parallel_size
    if cp > 1 and model.seq_length % (2 * cp):
        raise UserInputError(f"--seq-length={model.seq_length} must be divisible by 2 x --context-parallel-size={cp}")
    if cp > 1 and model.seq_length // (2 * cp) < model.cca_lookback:
        raise UserInputError(f"--seq-length={model.seq_length}: each of the 2 x --context-parallel-size={cp} chunks "
                             f"must hold at least the {model.cca_lookback} steps CCA's convolutions read back")
    if args.sequence_parallel and (model.seq_length // cp) % tp:
        raise UserInputError(f"--sequence-parallel: the sequence each rank holds ({model.seq_length} / "
                             f"--context-parallel-size={cp} = {model.seq_length // cp}) must be divisible by "
                             f"--tensor-model-parallel-size={tp}")


def _check_recompute(args: argparse.Namespace, model: ModelConfig) -> None:
    """Megatron's rules: --recompute-method / --recompute-num-layers only with --recompute-granularity
    full (selective recomputes the same pieces in every block); the defaults full leaves to the user
    are filled in (uniform, one block per unit). --recompute-activations means selective, as there;
    --moe-layer-recompute means selective with the moe module added; --recompute-modules only with
    selective, each name one this model has (model/recompute.py)."""
    for switch in ("recompute_activations", "moe_layer_recompute"):
        if getattr(args, switch):
            if args.recompute_granularity == "full":
                raise UserInputError(f"--{switch.replace('_', '-')} means --recompute-granularity selective, not "
                                     "full: give one of them")
            args.recompute_granularity = "selective"
    if args.moe_layer_recompute:
        args.recompute_modules = list(args.recompute_modules or recompute.DEFAULT_MODULES) + ["moe"]
    if args.recompute_modules is not None:
        if args.recompute_granularity != "selective":
            raise UserInputError("--recompute-modules needs --recompute-granularity selective"
                                 + (f", not {args.recompute_granularity}" if args.recompute_granularity else ""))
        try:
            args.recompute_modules = list(recompute.check_modules(args.recompute_modules))
        except ValueError as err:
            raise UserInputError(str(err)) from None
    if args.recompute_granularity != "full":
        for flag in ("recompute_method", "recompute_num_layers"):
            if getattr(args, flag) is not None:
                given = (f", not --recompute-granularity {args.recompute_granularity} (which recomputes the same "
                         f"pieces in every block)" if args.recompute_granularity else "")
                raise UserInputError(f"--{flag.replace('_', '-')} needs --recompute-granularity full{given}")
        return
    args.recompute_method = args.recompute_method or "uniform"
    if args.recompute_num_layers is None:
        args.recompute_num_layers = 1 if args.recompute_method == "uniform" else model.num_layers
    if args.recompute_num_layers > model.num_layers:
        raise UserInputError(f"--recompute-num-layers={args.recompute_num_layers} exceeds --num-layers="
                             f"{model.num_layers}")


def _decrease_batch_size(args: argparse.Namespace, data_parallel_size: int, warnings: list[str]) -> None:
    """Megatron-LM's --decrease-batch-size-if-needed: when --micro-batch-size x DP does not divide
    --global-batch-size (a restart on fewer healthy GPUs), the largest multiple of it below instead."""
    unit = args.micro_batch_size * data_parallel_size
    if args.global_batch_size % unit == 0:
        return
    if args.rampup_batch_size:
        raise UserInputError("--decrease-batch-size-if-needed does not combine with --rampup-batch-size: "
                             f"--global-batch-size={args.global_batch_size} is not a multiple of --micro-batch-size x "
                             f"data-parallel size = {unit}")
    smaller = args.global_batch_size // unit * unit
    if smaller == 0:
        raise UserInputError(f"--decrease-batch-size-if-needed: --global-batch-size={args.global_batch_size} is less "
                             f"than one micro-batch per data-parallel rank (--micro-batch-size x data-parallel size "
                             f"= {unit})")
    warnings.append(f"--decrease-batch-size-if-needed: global batch {smaller} instead of --global-batch-size="
                    f"{args.global_batch_size} (the largest multiple of --micro-batch-size x data-parallel size = "
                    f"{unit})")
    args.global_batch_size = smaller


def _check_scheduler_source(args: argparse.Namespace) -> None:
    if not args.use_checkpoint_opt_param_scheduler:
        return
    if not args.load:
        raise UserInputError("--use-checkpoint-opt_param-scheduler needs --load (the checkpoint whose schedules "
                             "to follow)")
    for flag, given in (("--override-opt_param-scheduler", args.override_opt_param_scheduler),
                        ("--finetune", args.finetune)):
        if given:
            raise UserInputError(f"--use-checkpoint-opt_param-scheduler and {flag} exclude each other: the "
                                 f"schedules come either from the checkpoint or from this run's flags")


def _check_split(args: argparse.Namespace) -> None:
    """--split parses like the data pipeline's, and gives training a share (there are iterations)."""
    shares = parse_split(args.split)
    if shares[0] == 0:
        raise UserInputError(f"--split {args.split}: the train share is 0, so there is no training data "
                             f"for the iterations to run")


def _check_tokenizer(args: argparse.Namespace) -> None:
    check_tokenizer_flags(args.tokenizer_type, args.tokenizer_model, args.vocab_file, args.merge_file,
                          **tiktoken_options(args))
    if args.tokenizer_type == "NullTokenizer" and args.vocab_size is not None:
        needed = int(args.tokenizer_model) + 1          # ids 0..N-1 and EOD = N
        if args.vocab_size < needed:
            raise UserInputError(f"--vocab-size={args.vocab_size} is smaller than the NullTokenizer vocabulary "
                                 f"({needed} ids with EOD for --tokenizer-model {args.tokenizer_model})")


def _check_validation(args: argparse.Namespace) -> None:
    """--full-validation / --multiple-validation-sets shape an evaluation that must happen."""
    for flag in ("full_validation", "multiple_validation_sets"):
        if getattr(args, flag) and not args.eval_iters:
            raise UserInputError(f"--{flag.replace('_', '-')} with --eval-iters 0: no evaluation runs; give "
                                 f"--eval-iters > 0 (evaluation on) or drop the flag")


def _check_skip_train(args: argparse.Namespace) -> None:
    if args.skip_train and not args.eval_iters:
        raise UserInputError("--skip-train only evaluates: give --eval-iters > 0")
    if args.skip_train and not (args.load or args.pretrained_checkpoint):
        raise UserInputError("--skip-train evaluates a trained model: give --load (or --pretrained-checkpoint)")
    if args.finetune and not (args.load or args.pretrained_checkpoint):
        raise UserInputError("--finetune starts from a checkpoint's weights: give --load (or --pretrained-checkpoint)")


def _check_non_persistent(args: argparse.Namespace) -> None:
    """Megatron-LM's non-persistent checkpoints, in their "global" form: written into --save."""
    kind = args.non_persistent_ckpt_type
    if kind in ("local", "in_memory"):
        raise UserInputError(f"--non-persistent-ckpt-type {kind} is not supported: only global (non-persistent "
                             f"checkpoints written into --save, removed once a newer one is complete)")
    folder = args.non_persistent_global_ckpt_dir
    if folder and not (args.save and os.path.realpath(folder) == os.path.realpath(args.save)):
        raise UserInputError(f"--non-persistent-global-ckpt-dir {folder}: non-persistent checkpoints are kept in "
                             f"--save here (a run resumes from the newest checkpoint of either kind there); drop the flag")
    if args.non_persistent_save_interval and not args.save:
        raise UserInputError("--non-persistent-save-interval needs --save (where the checkpoints go)")
    retain = args.save_retain_interval
    if retain and not (args.save and args.save_interval):
        raise UserInputError("--save-retain-interval needs --save and --save-interval (the checkpoints it thins out)")
    if retain and retain % args.save_interval:
        raise UserInputError(f"--save-retain-interval {retain} is not a multiple of --save-interval "
                             f"{args.save_interval}: no regular checkpoint would be retained")


def _check_paths(args: argparse.Namespace, prefixes: list[str]) -> list[str]:
    """Folders the run will create can be created (checked now, not after the model is built); returns the
    warnings of the index cache's folders (paths.check_index_cache_dirs)."""
    snapshot_dir = os.path.dirname(os.path.abspath(args.memory_snapshot_path)) if args.record_memory_history else None
    for flag, path in (("--save", args.save), ("--tensorboard-dir", args.tensorboard_dir),
                       ("--memory-snapshot-path", snapshot_dir)):
        if path:
            check_creatable_dir(flag, path)
    warnings = check_index_cache_dirs(prefixes, args.data_cache_path)
    if args.load and not args.use_checkpoint_args:     # that one checked it first (model_config_from_checkpoint)
        check_load_path(args.load)
    if args.pretrained_checkpoint:
        check_load_path(args.pretrained_checkpoint, "--pretrained-checkpoint")
    return warnings


SPLIT_PATH_FLAGS = ("train_data_path", "valid_data_path", "test_data_path")


def _read_text(flag: str, path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as err:
        raise UserInputError(f"{flag} {path}: cannot read ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise UserInputError(f"{flag} {path}: not UTF-8 text") from None


def _read_data_args_files(args: argparse.Namespace) -> None:
    """Megatron-LM's --data-args-path (the --data-path blend in a file) and --per-split-data-args-path
    (a JSON object of train / valid / test blends), read into the flags they stand for."""
    if args.data_args_path:
        if args.data_path:
            raise UserInputError("--data-args-path and --data-path exclude each other: the file holds the blend")
        args.data_path = _read_text("--data-args-path", args.data_args_path).split()
        if not args.data_path:
            raise UserInputError(f"--data-args-path {args.data_args_path}: the file is empty (it should hold the "
                                 f"blend, e.g. '30 data/web_text_document 70 data/code_text_document')")
    if args.per_split_data_args_path:
        path = args.per_split_data_args_path
        given = [flag for flag in ("data_path", *SPLIT_PATH_FLAGS) if getattr(args, flag)]
        if given:
            raise UserInputError(f"--per-split-data-args-path and --{given[0].replace('_', '-')} exclude each other")
        try:
            blends = json.loads(_read_text("--per-split-data-args-path", path))
        except ValueError as err:
            raise UserInputError(f"--per-split-data-args-path {path}: not valid JSON ({err})") from None
        if not isinstance(blends, dict) or not blends or set(blends) - {"train", "valid", "test"}:
            raise UserInputError(f"--per-split-data-args-path {path}: expected a JSON object with keys among "
                                 f"train, valid, test (got {blends if not isinstance(blends, dict) else sorted(blends)})")
        for split, blend in blends.items():
            words = blend.split() if isinstance(blend, str) else blend
            if not isinstance(words, list) or not all(isinstance(w, (str, int, float)) for w in words):
                raise UserInputError(f"--per-split-data-args-path {path}: '{split}' must be a list of weights and "
                                     f"prefixes, or one whitespace-separated string")
            setattr(args, f"{split}_data_path", [str(w) for w in words])


def _check_data(args: argparse.Namespace) -> list[str]:
    """--data-path and --split, or the per-split blends, and the tokenizer flags; returns the dataset
    prefixes (each once; none with --mock-data)."""
    separate = [name for name in SPLIT_PATH_FLAGS if getattr(args, name)]
    if args.mock_data:
        given = ["--" + name.replace("_", "-") for name in ("data_path", *SPLIT_PATH_FLAGS) if getattr(args, name)]
        if given:
            raise UserInputError(f"--mock-data and {given[0]} exclude each other")
        _check_split(args)              # mock data is cut by --split's shares too
        _check_tokenizer(args)
        return []
    if separate and args.data_path:
        raise UserInputError(f"--data-path and --{separate[0].replace('_', '-')} exclude each other: one blend cut "
                             f"by --split, or one blend per split")
    if separate and not args.train_data_path:
        raise UserInputError(f"--{separate[0].replace('_', '-')} needs --train-data-path")
    if not separate and not args.data_path:
        raise UserInputError("--data-path is required (or --train-data-path)")
    if not separate:
        _check_split(args)
    _check_tokenizer(args)
    if not separate:
        return check_data_path(args.data_path)
    prefixes = []
    for name in separate:
        prefixes += [p for p in check_data_path(getattr(args, name), "--" + name.replace("_", "-"))
                     if p not in prefixes]
    return prefixes


def validate(args: argparse.Namespace) -> RunConfig:
    """All flag checks, cheapest first; raises ValueError (UserInputError) naming the flag."""
    check_megatron_flags(args)
    if kernels.environment_problem():
        raise UserInputError(kernels.environment_problem())
    warnings = resolve_aliases(args)
    vocab_warning = megatron_tokenizer_vocab_size(args)
    if vocab_warning:
        warnings.append(vocab_warning)
    _read_data_args_files(args)
    if args.ckpt_step is not None:
        if not args.load:
            raise UserInputError(f"--ckpt-step {args.ckpt_step} needs --load (the folder holding that iteration)")
        args.load = checkpoint_at_step(args.load, args.ckpt_step)
    overrides = {name: getattr(args, name) for name in MODEL_FLAGS if getattr(args, name) is not None}
    if args.untie_embeddings_and_output_weights:
        overrides["untie_embeddings_and_output_weights"] = True
    source = checkpoint_args_source(args) if args.use_checkpoint_args else None   # its metadata, read once
    if source is not None:
        model = model_config_from_checkpoint(args, source).replace(**overrides)
        taken = tokenizer_args_from_checkpoint(args, source)
        if taken:
            vars(args).update(taken)
            warnings.append(f"--use-checkpoint-args: the tokenizer of the run that saved the checkpoint, "
                            f"--tokenizer-type {args.tokenizer_type} --tokenizer-model {args.tokenizer_model}")
    else:
        preset = args.preset or DEFAULT_PRESET
        preset_model = model_config_from_preset(preset)
        pad_placeholder_vocab(preset_model, overrides, args.tensor_model_parallel_size)   # (the tokenizer's replaces it)
        model = model_config_from_preset(preset, **overrides)
        shape_warning = preset_shape_warning(args, model, preset_model, preset)
        if shape_warning:
            warnings.append(shape_warning)
    check_moe_layer_freq(args, model.num_layers)

    if args.ddp_num_buckets is not None and args.ddp_bucket_size is not None:
        raise UserInputError(f"--ddp-num-buckets={args.ddp_num_buckets} and --ddp-bucket-size={args.ddp_bucket_size} "
                             "set the same thing: give one of them (as in Megatron-LM)")
    if args.use_mp_args_from_checkpoint_args:
        tp = tensor_parallel_from_checkpoint(source)
        if tp != args.tensor_model_parallel_size:
            warnings.append(f"--use-mp-args-from-checkpoint-args: --tensor-model-parallel-size {tp}, the checkpoint's "
                            f"(instead of {args.tensor_model_parallel_size})")
        args.tensor_model_parallel_size = tp
    if args.sequence_parallel and args.tensor_model_parallel_size == 1:     # Megatron-LM's rule, and its warning
        warnings.append("--sequence-parallel is off: it splits sequences over tensor-parallel ranks, and "
                        "--tensor-model-parallel-size is 1")
        args.sequence_parallel = False
    parallel = ParallelSizes(world_size_from_env(planning=args.dry_run), args.tensor_model_parallel_size,
                             args.context_parallel_size,
                             args.expert_model_parallel_size, args.sequence_parallel, args.use_distributed_optimizer,
                             args.ddp_bucket_size or DEFAULT_BUCKET_SIZE, args.ddp_num_buckets)
    check_layout(parallel.world_size, parallel.tensor_model_parallel_size, parallel.context_parallel_size,
                 parallel.expert_model_parallel_size, model, check_vocab=args.vocab_size is not None)
    _check_sequence_splits(args, model)
    _check_recompute(args, model)
    _check_scheduler_source(args)
    if args.decoupled_min_lr is not None and args.decoupled_lr is None:
        raise UserInputError("--decoupled-min-lr needs --decoupled-lr (the peak it decays from)")
    if args.moe_router_skip_target is not None and args.no_moe_router_bias_update:
        raise UserInputError(f"--moe-router-skip-target={args.moe_router_skip_target} needs the balancing-bias update "
                             f"that --no-moe-router-bias-update turns off")
    if args.moe_router_force_load_balancing:
        warnings.append("--moe-router-force-load-balancing: routing is forced to an even split (token i -> expert "
                        "i mod E), for benchmarks only: the model does not learn its routing")
    if args.log_progress and not args.save:
        warnings.append("--log-progress without --save: nothing is written (progress.txt goes into the --save folder)")
    saving = [flag for flag, given in (("--save-interval", args.save_interval), ("--async-save", args.async_save),
                                       ("--ckpt-keep", args.ckpt_keep)) if given]
    if saving and not args.save:     # (YAML configs set them; --save comes from the launch line)
        warnings.append(f"{', '.join(saving)} without --save: no checkpoint is written, so this run cannot be resumed")
    warnings += check_profile_flags(args, parallel.world_size, torch.cuda.is_available())
    if args.distributed_backend == "nccl" and not torch.cuda.is_available() and not args.dry_run:
        raise UserInputError("--distributed-backend nccl needs GPUs (NCCL/RCCL), and torch sees none here: give "
                             "gloo, or drop the flag (gloo on CPU, NCCL/RCCL on GPUs)")
    if not torch.cuda.is_available() and not args.dry_run:      # (a dry run checks a GPU job on a login node)
        chosen = (f"--config {args.config}" if args.config else "--use-checkpoint-args" if source is not None
                  else f"--preset {args.preset or DEFAULT_PRESET}")
        check_host_memory(model, parallel.tensor_model_parallel_size, parallel.expert_model_parallel_size,
                          ranks_on_this_machine(), chosen, bool(args.bf16 and args.use_distributed_optimizer))

    if (args.train_iters is None) == (args.train_samples is None):
        raise UserInputError("give exactly one of --train-iters and --train-samples")
    if args.rampup_batch_size and args.train_iters is not None:     # Megatron-LM refuses it too
        raise UserInputError("--rampup-batch-size needs --train-samples instead of --train-iters (as in Megatron-LM): "
                             "the ramp-up's iterations hold fewer samples, so an LR decay measured in iterations "
                             "would not reach --min-lr by the last one")
    check_number_domains(args)
    if args.global_batch_size is None:          # Megatron-LM's default: one micro-batch per data-parallel rank
        args.global_batch_size = args.micro_batch_size * parallel.data_parallel_size
    if args.decrease_batch_size_if_needed:
        _decrease_batch_size(args, parallel.data_parallel_size, warnings)
    schedule = BatchSizeSchedule(args.global_batch_size, args.micro_batch_size, parallel.data_parallel_size,
                                 args.rampup_batch_size)
    if args.train_iters is not None:
        total_iters = args.train_iters
    else:
        total_iters = schedule.iterations_for_samples(args.train_samples)
        if total_iters <= 0:
            raise UserInputError(f"--train-samples={args.train_samples} is less than one global batch: "
                                 f"no iteration to run")
    if total_iters * args.global_batch_size >= 2**62:      # past what the sample indices' arrays can hold
        which = "--train-samples" if args.train_iters is None else "--train-iters x --global-batch-size"
        raise UserInputError(f"{which}: {total_iters * args.global_batch_size} samples, more than a run can count "
                             f"(2**62)")
    for n in args.iterations_to_skip or ():
        if n < 0:
            raise UserInputError(f"--iterations-to-skip {n}: a number of completed iterations, >= 0 (as Megatron-LM "
                                 f"counts: N skips the step logged as iteration N + 1)")
        # (a --train-samples run that loads a checkpoint ends where the samples run out from its position)
        if n >= total_iters and not (args.load and args.train_iters is None):
            warnings.append(f"--iterations-to-skip {n}: the run ends at iteration {total_iters}, never reaching it")
    decoupled_lr_schedule(lr_schedule_from_flags(args.lr, args, total_iters), args)
    weight_decay_schedule_from_flags(args, total_iters)

    from megatron_zaya.data import DataConfig
    prefixes = _check_data(args)
    warnings += _check_paths(args, prefixes)
    _check_non_persistent(args)
    _check_skip_train(args)
    _check_validation(args)
    data = DataConfig(data_path=args.data_path, train_data_path=args.train_data_path,
                      valid_data_path=args.valid_data_path, test_data_path=args.test_data_path, mock_data=args.mock_data,
                      split=args.split, data_cache_path=args.data_cache_path,
                      seed=args.seed, num_workers=args.num_workers, reset_position_ids=args.reset_position_ids,
                      reset_attention_mask=args.reset_attention_mask, eod_mask_loss=args.eod_mask_loss,
                      tokenizer_type=args.tokenizer_type, tokenizer_model=args.tokenizer_model,
                      vocab_file=args.vocab_file, merge_file=args.merge_file, mmap_bin_files=args.mmap_bin_files,
                      mid_level_dataset_surplus=args.mid_level_dataset_surplus,
                      multiple_validation_sets=args.multiple_validation_sets, full_validation=args.full_validation,
                      **tiktoken_options(args))

    train_fields = {f.name for f in fields(TrainConfig)}
    train = TrainConfig(**{k: v for k, v in vars(args).items() if k in train_fields})
    train.moe_router_bias_update = not args.no_moe_router_bias_update
    optim = OptimizerConfig(optimizer=args.optimizer, lr=args.lr, weight_decay=args.weight_decay,
                            adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
                            muon_momentum=args.muon_momentum, muon_ns_steps=args.muon_num_ns_steps,
                            muon_tp_mode=args.muon_tp_mode, muon_scale_mode=args.muon_scale_mode,
                            muon_extra_scale_factor=args.muon_extra_scale_factor,
                            clip_grad=args.clip_grad, decoupled_lr=args.decoupled_lr,
                            embedding_weight_decay=model.embedding_init_method_std is None)
    return RunConfig(model, train, optim, parallel, data, args, warnings)
