"""Megatron-named command-line flags (+ an optional YAML file) -> validated config objects.

Everything is checked here, before any process group, allocation or data loading: a bad value stops
the run with one line naming the flag. Flags given on the command line override `--config FILE.yaml`
(keys spelled like the flags, with dashes or underscores), which overrides the `--preset` model.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass, field, fields

import torch
import yaml

from megatron_zaya.checkpoint.format import COMPLETE_MARKER, ITER_RE, LATEST_FILE, METADATA_FILE, iter_dir_name
from megatron_zaya.checkpoint.preflight import first_candidate_metadata
from megatron_zaya.config import PRESETS, ConfigError, ModelConfig, model_config_from_preset
from megatron_zaya.data.blend import parse_data_path
from megatron_zaya.data.gpt_dataset import default_cache_dir
from megatron_zaya.data.index_builders import parse_split
from megatron_zaya.data.indexed import IndexedDatasetError, check_indexed_dataset
from megatron_zaya.data.tokenizer import add_tiktoken_arguments, check_tokenizer_flags, tiktoken_options
from megatron_zaya.errors import UserInputError
from megatron_zaya.megatron_flags import add_megatron_flags, check_megatron_flags, resolve_aliases
from megatron_zaya.optim.builder import MUON_TP_MODES, OptimizerConfig
from megatron_zaya.parallel.launch import DEFAULT_TIMEOUT_MINUTES
from megatron_zaya.parallel.state import LayoutError, check_layout
from megatron_zaya.optim.schedules import (DECAY_STYLES, WD_INCR_STYLES, WSD_DECAY_STYLES, lr_schedule_from_flags,
                                           weight_decay_schedule_from_flags)
from megatron_zaya.training.batch_schedule import BatchSizeSchedule
from megatron_zaya.training.config import TrainConfig
from megatron_zaya.training.profiling import check_profile_flags

DEFAULT_PRESET = "zaya1-tiny"
MODEL_FLAGS = {  # flag -> type; None means "keep the preset's value"
    "num_layers": int, "hidden_size": int, "num_attention_heads": int, "num_query_groups": int,
    "kv_channels": int, "seq_length": int, "max_position_embeddings": int, "rotary_base": float,
    "rotary_percent": float, "norm_epsilon": float, "num_experts": int, "moe_router_topk": int,
    "moe_ffn_hidden_size": int, "router_hidden_size": int, "make_vocab_size_divisible_by": int,
    "init_method_std": float, "vocab_size": int,
}


@dataclass
class ParallelSizes:
    world_size: int
    tensor_model_parallel_size: int = 1
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = False
    ddp_bucket_size: int = 40_000_000

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


def world_size_from_env() -> int:
    for var in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"):
        if os.environ.get(var):
            return int(os.environ[var])
    return 1


# Megatron-LM switches for metrics this trainer always logs (console and TensorBoard): accepted, so
# that existing launch scripts run unchanged, and otherwise ignored.
ALWAYS_LOGGED = ("--log-throughput", "--log-timers-to-tensorboard", "--log-validation-ppl-to-tensorboard",
                 "--log-memory-to-tensorboard", "--log-params-norm", "--log-learning-rate-to-tensorboard",
                 "--moe-per-layer-logging")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pretrain_zaya.py", description="Pretrain a ZAYA1-style MoE model.",
                                allow_abbrev=False)
    p.add_argument("--config", help="YAML file of flags (command-line flags override it)")
    g = p.add_argument_group("model")
    g.add_argument("--preset", default=None,
                   help=f"model preset: {', '.join(sorted(PRESETS))} (default {DEFAULT_PRESET})")
    for name, kind in MODEL_FLAGS.items():
        g.add_argument("--" + name.replace("_", "-"), type=kind, default=None)
    g.add_argument("--untie-embeddings-and-output-weights", action="store_true", default=None)
    g = p.add_argument_group("parallelism")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--context-parallel-size", type=int, default=1)
    g.add_argument("--expert-model-parallel-size", type=int, default=1)
    g.add_argument("--sequence-parallel", action="store_true")
    g.add_argument("--use-distributed-optimizer", action="store_true")
    g.add_argument("--ddp-bucket-size", type=int, default=40_000_000,
                   help="elements per gradient bucket; a bucket's all-reduce (reduce-scatter under ZeRO-1) "
                        "starts as soon as its last gradient is ready, overlapping the rest of the backward")
    g.add_argument("--distributed-backend", choices=["nccl", "gloo"], default=None)
    g.add_argument("--distributed-timeout-minutes", type=float, default=DEFAULT_TIMEOUT_MINUTES,
                   help="how long a collective may wait before the process group gives up")
    g = p.add_argument_group("batch and schedule")
    g.add_argument("--micro-batch-size", type=int, default=4)
    g.add_argument("--global-batch-size", type=int, default=16)
    g.add_argument("--rampup-batch-size", type=int, nargs=3, default=None, metavar=("START", "INCR", "SAMPLES"))
    g.add_argument("--train-iters", type=int, default=None)
    g.add_argument("--train-samples", type=int, default=None)
    g.add_argument("--optimizer", choices=["muon", "adamw"], default="muon")
    g.add_argument("--lr", type=float, default=3e-4)
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--decoupled-lr", type=float, default=None,
                   help="the embedding's and output layer's own peak lr, on the same schedule (as in Megatron-LM)")
    g.add_argument("--decoupled-min-lr", type=float, default=None,
                   help="their floor (default --min-lr); needs --decoupled-lr")
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--lr-decay-iters", type=int, default=None)
    g.add_argument("--lr-decay-style", choices=DECAY_STYLES, default="cosine")
    g.add_argument("--lr-wsd-decay-iters", type=int, default=0)
    g.add_argument("--lr-wsd-decay-style", choices=WSD_DECAY_STYLES, default="linear")
    g.add_argument("--lr-warmup-samples", type=int, default=0, help="with --train-samples: warmup length in samples")
    g.add_argument("--lr-decay-samples", type=int, default=None,
                   help="with --train-samples: decay length in samples (default: --train-samples)")
    g.add_argument("--lr-wsd-decay-samples", type=int, default=0, help="with --train-samples: WSD's final decay")
    g.add_argument("--lr-warmup-fraction", type=float, default=None,
                   help="warmup as a fraction of the decay length (instead of --lr-warmup-iters/-samples)")
    g.add_argument("--lr-warmup-init", type=float, default=0.0, help="the lr the warmup starts from")
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--weight-decay-incr-style", choices=WD_INCR_STYLES, default="constant",
                   help="linear / cosine: decay moves from --start-weight-decay to --end-weight-decay over the run")
    g.add_argument("--start-weight-decay", type=float, default=None)
    g.add_argument("--end-weight-decay", type=float, default=None)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.95)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--muon-momentum", type=float, default=0.95)
    g.add_argument("--muon-num-ns-steps", type=int, default=5, help="Newton-Schulz iterations per Muon update")
    g.add_argument("--muon-tp-mode", choices=MUON_TP_MODES, default="duplicated",
                   help="Muon under tensor parallelism: duplicated gathers each split matrix over the TP group and "
                        "orthogonalises it whole (the single-device update, TP x the Newton-Schulz work); "
                        "blockwise orthogonalises each rank's slice (Megatron-LM's default; depends on the TP size)")
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--bf16", action="store_true")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--recompute-granularity", choices=["full", "selective"], default=None,
                   help="full: keep only the inputs of the recomputed blocks and run them again in the backward; "
                        "selective: every block recomputes its cheap pieces (norm internals, QK-norm and RoPE, "
                        "GELU/SwiGLU outputs, and the attention core where SDPA's math path keeps S x S scores)")
    g.add_argument("--recompute-activations", action="store_true",
                   help="Megatron-LM's switch for --recompute-granularity selective")
    g.add_argument("--recompute-method", choices=["uniform", "block"], default=None,
                   help="with --recompute-granularity full: uniform (default): all blocks, in runs of "
                        "--recompute-num-layers; block: only the first --recompute-num-layers blocks")
    g.add_argument("--recompute-num-layers", type=int, default=None,
                   help="with --recompute-granularity full: default 1 (uniform) or all (block)")
    g.add_argument("--moe-router-bias-lr", type=float, default=None,
                   help="lr of the Adam that moves the balancing biases (default 1e-2)")
    g.add_argument("--moe-router-bias-beta1", type=float, default=0.9)
    g.add_argument("--moe-router-bias-beta2", type=float, default=0.999)
    g.add_argument("--no-moe-router-bias-update", action="store_true")
    g = p.add_argument_group("data")
    g.add_argument("--data-path", nargs="+", default=None)
    g.add_argument("--mock-data", action="store_true",
                   help="random tokens instead of a dataset (no files; try a model or layout, or benchmark)")
    for split in ("train", "valid", "test"):
        g.add_argument(f"--{split}-data-path", nargs="+", default=None,
                       help=f"instead of --data-path and --split: the {split} blend (every document in it)")
    g.add_argument("--split", default="969,30,1")
    g.add_argument("--tokenizer-type", default="GPTSentencePieceTokenizer")
    g.add_argument("--tokenizer-model", default=None)
    g.add_argument("--vocab-file", default=None, help="GPT2BPETokenizer: GPT-2's vocab.json")
    g.add_argument("--merge-file", default=None, help="GPT2BPETokenizer: GPT-2's merges.txt")
    add_tiktoken_arguments(g, vocab_size_flag=False)    # TikTokenizer's size is --vocab-size (see validate)
    g.add_argument("--data-cache-path", default=None)
    g.add_argument("--num-workers", type=int, default=2)
    g.add_argument("--no-mmap-bin-files", dest="mmap_bin_files", action="store_false",
                   help="read the .bin files with positional reads instead of memory-mapping them")
    g.add_argument("--reset-position-ids", action="store_true")
    g.add_argument("--reset-attention-mask", action="store_true")
    g.add_argument("--eod-mask-loss", action="store_true")
    g = p.add_argument_group("checkpoints")
    g.add_argument("--save", default=None)
    g.add_argument("--load", default=None)
    g.add_argument("--save-interval", type=int, default=None)
    g.add_argument("--ckpt-keep", type=int, default=None)
    g.add_argument("--async-save", action="store_true")
    g.add_argument("--no-load-optim", action="store_true")
    g.add_argument("--no-save-optim", action="store_true",
                   help="checkpoints without optimizer state (smaller; a resume from them needs --no-load-optim)")
    g.add_argument("--no-save-rng", action="store_true", help="checkpoints without the RNG states")
    g.add_argument("--no-load-rng", action="store_true")
    g.add_argument("--finetune", action="store_true")
    g.add_argument("--use-checkpoint-args", action="store_true",
                   help="the model config of --load's checkpoint instead of --preset's; model flags given on the "
                        "command line still override it (as in Megatron-LM)")
    g.add_argument("--use-checkpoint-opt_param-scheduler", action="store_true",
                   help="the LR and weight-decay schedules from the flags of the run that saved --load's "
                        "checkpoint, not from this run's (as in Megatron-LM)")
    g = p.add_argument_group("logging and exits")
    g.add_argument("--log-interval", type=int, default=10)
    g.add_argument("--eval-interval", type=int, default=1000)
    g.add_argument("--eval-iters", type=int, default=10)
    g.add_argument("--tensorboard-dir", default=None)
    g.add_argument("--tensorboard-log-interval", type=int, default=1,
                   help="write TensorBoard scalars every N iterations (the console line: --log-interval)")
    g.add_argument("--tensorboard-queue-size", type=int, default=1000,
                   help="TensorBoard events buffered before a write to disk")
    for flag in ALWAYS_LOGGED:
        g.add_argument(flag, action="store_true", help="accepted for Megatron-LM scripts: always logged here")
    g.add_argument("--progress-bar", action="store_true", help="tqdm progress bar (short local runs)")
    g.add_argument("--log-num-zeros-in-grad", action="store_true",
                   help="count the exactly-zero elements of the reduced gradient every step (console and "
                        "TensorBoard 'num-zeros'; one more pass over the gradients)")
    g.add_argument("--log-progress", action="store_true",
                   help="append job starts and, at every checkpoint, throughput, FLOPs and tokens so far to "
                        "--save/progress.txt (as Megatron-LM; it continues across resubmitted jobs)")
    g.add_argument("--log-straggler", action="store_true",
                   help="every --log-interval: the slowest and fastest ranks by their own forward+backward time "
                        "(megatron_zaya/training/stragglers.py)")
    g.add_argument("--straggler-minmax-count", type=int, default=1, help="ranks named at each end")
    g.add_argument("--peak-tflops", type=float, default=None, help="per-device peak for MFU (default: table/measured)")
    g.add_argument("--exit-interval", type=int, default=None)
    g.add_argument("--exit-duration-in-mins", type=float, default=None)
    g.add_argument("--manual-gc", action="store_true",
                   help="turn Python's automatic garbage collection off (its pauses differ between ranks and "
                        "stall collectives); collect every --manual-gc-interval iterations instead")
    g.add_argument("--manual-gc-interval", type=int, default=0, help="with --manual-gc: 0 never collects")
    g.add_argument("--empty-unused-memory-level", type=int, default=0, choices=(0, 1, 2),
                   help="GPU: return the allocator's unused blocks after forward+backward (1), and after the "
                        "optimizer step too (2), against fragmentation (as in Megatron-LM)")
    g = p.add_argument_group("profiling (megatron_zaya/training/profiling.py)")
    g.add_argument("--profile", action="store_true",
                   help="profile the iterations run while the completed count is in [--profile-step-start, "
                        "--profile-step-end): with --use-pytorch-profiler by torch.profiler (CPU or GPU), else "
                        "through the CUDA profiler API for nsys / rocprof (GPU)")
    g.add_argument("--use-pytorch-profiler", action="store_true",
                   help="torch.profiler traces and op tables into --tensorboard-dir")
    g.add_argument("--profile-step-start", type=int, default=10)
    g.add_argument("--profile-step-end", type=int, default=12)
    g.add_argument("--profile-ranks", type=int, nargs="+", default=[0], help="global ranks that profile")
    g.add_argument("--pytorch-profiler-collect-shapes", action="store_true",
                   help="record op input shapes (and an op table by shape)")
    g.add_argument("--pytorch-profiler-collect-callstack", action="store_true", help="record Python call stacks")
    g.add_argument("--record-memory-history", action="store_true",
                   help="GPU: record the caching allocator's history; snapshot to --memory-snapshot-path")
    g.add_argument("--memory-snapshot-path", default="snapshot.pickle")
    add_megatron_flags(p)
    return p


def _yaml_error(parser: argparse.ArgumentParser, path: str, key, message: str):
    parser.error(f"--config {path}: key {key!r} {message}")


def _convert_word(parser, path: str, key, action: argparse.Action, word: str):
    """One word through the flag's argparse `type` and `choices`, as on a command line."""
    try:
        value = action.type(word) if action.type else word
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        kind = getattr(action.type, "__name__", "")
        _yaml_error(parser, path, key, f"has an invalid {kind} value {word!r}")
    if action.choices is not None and value not in action.choices:
        _yaml_error(parser, path, key, f"has value {word!r}; choose one of {list(action.choices)}")
    return value


def _yaml_words(parser, path: str, key, action: argparse.Action, value) -> list[str]:
    """The command-line words a YAML value stands for: a list gives one word per item, a string
    is split on whitespace (as a shell would), a number is one word."""
    items = value if isinstance(value, list) else (value.split() if isinstance(value, str) else [value])
    if any(isinstance(x, (list, dict, bool)) or x is None for x in items):
        _yaml_error(parser, path, key, f"expects numbers or strings, got {value!r}")
    if isinstance(action.nargs, int) and len(items) != action.nargs:
        _yaml_error(parser, path, key, f"expects {action.nargs} values, got {value!r}")
    if not items:
        _yaml_error(parser, path, key, "expects at least one value")
    return [str(x) for x in items]


def _yaml_value(parser: argparse.ArgumentParser, path: str, key, action: argparse.Action, value):
    """A YAML value converted exactly as argparse converts the same flag on the command line;
    anything argparse would reject stops with one line naming the file, the key and the value."""
    if isinstance(action, argparse._StoreConstAction):        # store_true / store_false
        if not isinstance(value, bool):
            _yaml_error(parser, path, key, f"is an on/off flag: give true or false, not {value!r}")
        return action.const if value else action.default
    if value is None:
        if action.default is not None:
            _yaml_error(parser, path, key, "has no value")
        return None
    if action.nargs in ("+", "*") or isinstance(action.nargs, int):
        return [_convert_word(parser, path, key, action, w) for w in _yaml_words(parser, path, key, action, value)]
    if isinstance(value, (list, dict, bool)):
        _yaml_error(parser, path, key, f"expects a single value (as on the command line), got {value!r}")
    return _convert_word(parser, path, key, action, str(value))


def _apply_yaml_defaults(parser: argparse.ArgumentParser, path: str) -> None:
    """Make the keys of the YAML file `path` the parser's defaults (so command-line flags win)."""
    if not os.path.isfile(path):
        parser.error(f"--config {path}: file not found")
    try:
        with open(path) as f:
            values = yaml.safe_load(f) or {}
    except yaml.YAMLError as err:
        parser.error(f"--config {path}: not valid YAML ({err})")
    if not isinstance(values, dict):
        parser.error(f"--config {path}: expected a mapping of flag names to values")
    actions = {a.dest: a for a in parser._actions if not isinstance(a, argparse._HelpAction)}
    defaults = {}
    for key, value in values.items():
        dest = str(key).lstrip("-").replace("-", "_")
        if dest not in actions or dest == "config":
            parser.error(f"--config {path}: unknown key {key!r}")
        defaults[dest] = _yaml_value(parser, path, key, actions[dest], value)
    parser.set_defaults(**defaults)


def parse_args(argv=None) -> RunConfig:
    parser = build_parser()
    pre, _ = parser.parse_known_args(argv)
    if pre.config:
        _apply_yaml_defaults(parser, pre.config)
    args = parser.parse_args(argv)
    try:
        return validate(args)
    except (ConfigError, LayoutError, ValueError) as err:
        parser.error(str(err))


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
    ("weight_decay", _ge0, "must be >= 0"), ("clip_grad", _ge0, "must be >= 0 (0 turns clipping off)"),
    ("adam_beta1", _unit, "must be in [0, 1)"), ("adam_beta2", _unit, "must be in [0, 1)"),
    ("adam_eps", _gt0, "must be > 0"), ("muon_momentum", _unit, "must be in [0, 1)"),
    ("muon_num_ns_steps", _ge1, "must be >= 1"),
    ("moe_router_bias_lr", _ge0, "must be >= 0"), ("moe_router_bias_beta1", _unit, "must be in [0, 1)"),
    ("moe_router_bias_beta2", _unit, "must be in [0, 1)"), ("num_workers", _ge0, "must be >= 0"),
    ("save_interval", _ge1, "must be >= 1"), ("ckpt_keep", _ge1, "must be >= 1"),
    ("exit_interval", _ge1, "must be >= 1"), ("exit_duration_in_mins", _gt0, "must be > 0"),
    ("peak_tflops", _gt0, "must be > 0"), ("ddp_bucket_size", _ge1, "must be >= 1"),
    ("tensorboard_log_interval", _ge1, "must be >= 1"), ("tensorboard_queue_size", _ge1, "must be >= 1"),
    ("recompute_num_layers", _ge1, "must be >= 1"), ("straggler_minmax_count", _ge1, "must be >= 1"),
)


def check_number_domains(args: argparse.Namespace) -> None:
    """Range checks of the numeric flags (NUMBER_DOMAINS); raises UserInputError naming the flag."""
    for dest, ok, domain in NUMBER_DOMAINS:
        value = getattr(args, dest, None)
        if value is not None and not ok(value):
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


def check_creatable_dir(flag: str, path: str) -> None:
    """`path` is a directory, or can be created: the nearest existing ancestor is a directory in
    which a folder can be made (tried with a temporary folder, removed at once: os.access says yes
    to root everywhere, even in /proc)."""
    probe = os.path.abspath(path)
    if os.path.exists(probe) and not os.path.isdir(probe):
        raise UserInputError(f"{flag} {path}: exists and is not a directory")
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise UserInputError(f"{flag} {path}: {probe} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".megatron-zaya-check-", dir=probe))
    except OSError as err:
        raise UserInputError(f"{flag} {path}: cannot create folders in {probe} ({err.strerror})") from None


def _latest_iteration_folder(path: str) -> str | None:
    """The folder --load PATH would read: PATH itself if it is one iteration's folder, else the one
    the tracker file names (Megatron-LM's "release" too), else the highest iter_NNNNNNN."""
    if ITER_RE.match(os.path.basename(os.path.normpath(path))) or os.path.isfile(os.path.join(path, METADATA_FILE)):
        return path
    try:
        with open(os.path.join(path, LATEST_FILE)) as f:
            text = f.read().strip()
        name = "release" if text == "release" else iter_dir_name(int(text))
        if os.path.isdir(os.path.join(path, name)):
            return os.path.join(path, name)
    except (OSError, ValueError):
        pass
    iterations = [name for name in os.listdir(path) if ITER_RE.match(name)]
    return os.path.join(path, max(iterations)) if iterations else None


def _megatron_lm_files(folder: str) -> list[str]:
    """Megatron-LM checkpoint entries (mp_rank_* folders, *.pt, *.distcp) in a folder that has no
    megatron-zaya files (COMPLETE marker, rank_*.safetensors); [] otherwise."""
    names = sorted(os.listdir(folder))
    if COMPLETE_MARKER in names or any(n.startswith("rank_") and n.endswith(".safetensors") for n in names):
        return []
    return [n for n in names if (n.startswith("mp_rank_") and os.path.isdir(os.path.join(folder, n)))
            or n.endswith((".pt", ".distcp"))]


def check_load_path(path: str) -> None:
    """--load: a missing folder means "train from scratch" (Megatron-LM's behaviour, with a
    warning later); a file, or a Megatron-LM checkpoint, is an error before the model is built."""
    if not os.path.exists(path):
        return
    if not os.path.isdir(path):
        raise UserInputError(f"--load {path}: not a directory")
    folder = _latest_iteration_folder(path)
    foreign = _megatron_lm_files(folder) if folder else []
    if foreign:
        raise UserInputError(
            f"--load {path}: {folder} is not a megatron-zaya checkpoint (looks like Megatron-LM: "
            f"{', '.join(foreign[:3])}); convert its weights to a Hugging Face ZAYA folder, then run tools/convert_checkpoint.py from-hf HF DIR "
            f"and use --load DIR --finetune")


def _megatron_tokenizer_vocab_size(args: argparse.Namespace) -> None:
    """Where Megatron-LM reads --vocab-size as the TOKENIZER's size, not the model's, whose
    vocabulary is then the tokenizer's padded, as Megatron pads it:
    - `--tokenizer-type NullTokenizer --vocab-size N` (no --tokenizer-model): ids 0..N-1, EOD = N;
      rewritten into this project's form, --tokenizer-model N;
    - `--tokenizer-type TikTokenizer --vocab-size N`: special tokens and ranks together; moved to
      `tokenizer_vocab_size`."""
    args.tokenizer_vocab_size = None
    if args.tokenizer_type == "NullTokenizer" and args.tokenizer_model is None and args.vocab_size is not None:
        args.tokenizer_model, args.vocab_size = str(args.vocab_size), None
    elif args.tokenizer_type == "TikTokenizer" and args.vocab_size is not None:
        args.tokenizer_vocab_size, args.vocab_size = args.vocab_size, None


def _check_sequence_splits(args: argparse.Namespace, model: ModelConfig) -> None:
    """Sequence-length rules of context and sequence parallelism, checked before any process group:
    CP cuts the sequence into 2 x CP chunks; SP splits each rank's chunk over TP."""
    tp, cp = args.tensor_model_parallel_size, args.context_parallel_size
    if cp > 1 and model.seq_length % (2 * cp):
        raise UserInputError(f"--seq-length={model.seq_length} must be divisible by 2 x --context-parallel-size={cp}")
    if cp > 1 and args.reset_attention_mask:
        raise UserInputError(f"--reset-attention-mask is not supported with --context-parallel-size={cp} "
                             f"(CP attention is the causal default; drop the flag or use CP=1)")
    if args.sequence_parallel and tp == 1:
        raise UserInputError("--sequence-parallel needs --tensor-model-parallel-size > 1")
    if args.sequence_parallel and (model.seq_length // cp) % tp:
        raise UserInputError(f"--sequence-parallel: the sequence each rank holds ({model.seq_length} / "
                             f"--context-parallel-size={cp} = {model.seq_length // cp}) must be divisible by "
                             f"--tensor-model-parallel-size={tp}")


def _check_recompute(args: argparse.Namespace, model: ModelConfig) -> None:
    """Megatron's rules: --recompute-method / --recompute-num-layers only with --recompute-granularity
    full (selective recomputes the same pieces in every block); the defaults full leaves to the user
    are filled in (uniform, one block per unit). --recompute-activations means selective, as there."""
    if args.recompute_activations:
        if args.recompute_granularity == "full":
            raise UserInputError("--recompute-activations means --recompute-granularity selective, not full: "
                                 "give one of them")
        args.recompute_granularity = "selective"
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


def model_config_from_checkpoint(args: argparse.Namespace) -> ModelConfig:
    """--use-checkpoint-args: the model config saved with the checkpoint --load starts from (the first
    one with readable metadata, as the load itself will try). Its vocabulary size counts as given, so
    the tokenizer's padded size does not replace it (a different tokenizer is then an error)."""
    if not args.load:
        raise UserInputError("--use-checkpoint-args needs --load (the checkpoint to take the model config from)")
    if args.preset:
        raise UserInputError(f"--use-checkpoint-args and --preset {args.preset} exclude each other: the model "
                             f"config comes from --load's checkpoint")
    check_load_path(args.load)
    found = first_candidate_metadata(args.load)
    if found is None or not found[1].get("model_config"):
        raise UserInputError(f"--use-checkpoint-args: --load {args.load} holds no checkpoint with a model config "
                             f"in its {METADATA_FILE}")
    folder, meta = found
    try:
        model = ModelConfig(**meta["model_config"])
    except TypeError as err:
        raise UserInputError(f"--use-checkpoint-args: {os.path.join(folder, METADATA_FILE)}: not a model config "
                             f"of this version ({err})") from None
    if args.vocab_size is None:
        args.vocab_size = model.vocab_size
    return model


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


def _check_paths(args: argparse.Namespace, prefixes: list[str]) -> None:
    """Folders the run will create can be created (checked now, not after the model is built)."""
    snapshot_dir = os.path.dirname(os.path.abspath(args.memory_snapshot_path)) if args.record_memory_history else None
    for flag, path in (("--save", args.save), ("--tensorboard-dir", args.tensorboard_dir),
                       ("--data-cache-path", args.data_cache_path), ("--memory-snapshot-path", snapshot_dir)):
        if path:
            check_creatable_dir(flag, path)
    if not args.data_cache_path and prefixes:
        default = default_cache_dir(prefixes[0])
        if not os.path.isdir(default):
            check_creatable_dir("index cache (no --data-cache-path; default beside the data)", default)
    if args.load:
        check_load_path(args.load)


SPLIT_PATH_FLAGS = ("train_data_path", "valid_data_path", "test_data_path")


def _check_data(args: argparse.Namespace) -> list[str]:
    """--data-path and --split, or the per-split blends, and the tokenizer flags; returns the dataset
    prefixes (each once; none with --mock-data)."""
    separate = [name for name in SPLIT_PATH_FLAGS if getattr(args, name)]
    if args.mock_data:
        given = ["--" + name.replace("_", "-") for name in ("data_path", *SPLIT_PATH_FLAGS) if getattr(args, name)]
        if given:
            raise UserInputError(f"--mock-data and {given[0]} exclude each other")
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
    warnings = resolve_aliases(args)
    _megatron_tokenizer_vocab_size(args)
    overrides = {name: getattr(args, name) for name in MODEL_FLAGS if getattr(args, name) is not None}
    if args.untie_embeddings_and_output_weights:
        overrides["untie_embeddings_and_output_weights"] = True
    if args.use_checkpoint_args:
        model = model_config_from_checkpoint(args).replace(**overrides)
    else:
        model = model_config_from_preset(args.preset or DEFAULT_PRESET, **overrides)

    parallel = ParallelSizes(world_size_from_env(), args.tensor_model_parallel_size, args.context_parallel_size,
                             args.expert_model_parallel_size, args.sequence_parallel, args.use_distributed_optimizer,
                             args.ddp_bucket_size)
    check_layout(parallel.world_size, parallel.tensor_model_parallel_size, parallel.context_parallel_size,
                 parallel.expert_model_parallel_size, model)
    _check_sequence_splits(args, model)
    _check_recompute(args, model)
    _check_scheduler_source(args)
    if args.decoupled_min_lr is not None and args.decoupled_lr is None:
        raise UserInputError("--decoupled-min-lr needs --decoupled-lr (the peak it decays from)")
    if args.log_progress and not args.save:
        warnings.append("--log-progress without --save: nothing is written (progress.txt goes into the --save folder)")
    warnings += check_profile_flags(args, parallel.world_size, torch.cuda.is_available())

    if (args.train_iters is None) == (args.train_samples is None):
        raise UserInputError("give exactly one of --train-iters and --train-samples")
    check_number_domains(args)
    schedule = BatchSizeSchedule(args.global_batch_size, args.micro_batch_size, parallel.data_parallel_size,
                                 args.rampup_batch_size)
    if args.train_iters is not None:
        total_iters = args.train_iters
    else:
        total_iters = schedule.iterations_for_samples(args.train_samples)
        if total_iters <= 0:
            raise UserInputError(f"--train-samples={args.train_samples} is less than one global batch: "
                                 f"no iteration to run")
    lr_schedule_from_flags(args.lr, args, total_iters)
    weight_decay_schedule_from_flags(args, total_iters)

    from megatron_zaya.data import DataConfig
    prefixes = _check_data(args)
    _check_paths(args, prefixes)
    data = DataConfig(data_path=args.data_path, train_data_path=args.train_data_path,
                      valid_data_path=args.valid_data_path, test_data_path=args.test_data_path, mock_data=args.mock_data,
                      split=args.split, data_cache_path=args.data_cache_path,
                      seed=args.seed, num_workers=args.num_workers, reset_position_ids=args.reset_position_ids,
                      reset_attention_mask=args.reset_attention_mask, eod_mask_loss=args.eod_mask_loss,
                      tokenizer_type=args.tokenizer_type, tokenizer_model=args.tokenizer_model,
                      vocab_file=args.vocab_file, merge_file=args.merge_file, mmap_bin_files=args.mmap_bin_files,
                      **tiktoken_options(args))

    train_fields = {f.name for f in fields(TrainConfig)}
    train = TrainConfig(**{k: v for k, v in vars(args).items() if k in train_fields})
    train.moe_router_bias_update = not args.no_moe_router_bias_update
    optim = OptimizerConfig(optimizer=args.optimizer, lr=args.lr, weight_decay=args.weight_decay,
                            adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
                            muon_momentum=args.muon_momentum, muon_ns_steps=args.muon_num_ns_steps,
                            muon_tp_mode=args.muon_tp_mode, clip_grad=args.clip_grad, decoupled_lr=args.decoupled_lr)
    return RunConfig(model, train, optim, parallel, data, args, warnings)
