"""Megatron-named command-line flags (+ an optional YAML file) -> validated config objects.

Everything is checked here, before any process group, allocation or data loading: a bad value stops
the run with one line naming the flag. Flags given on the command line override `--config FILE.yaml`
(keys spelled like the flags, with dashes or underscores), which overrides the `--preset` model.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields

import yaml

from megatron_zaya.config import PRESETS, ConfigError, ModelConfig, model_config_from_preset
from megatron_zaya.optim.builder import OptimizerConfig
from megatron_zaya.parallel.state import LayoutError, check_layout
from megatron_zaya.optim.schedules import DECAY_STYLES, WSD_DECAY_STYLES, LRSchedule
from megatron_zaya.training.batch_schedule import BatchSizeSchedule
from megatron_zaya.training.config import TrainConfig

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


def world_size_from_env() -> int:
    for var in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"):
        if os.environ.get(var):
            return int(os.environ[var])
    return 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pretrain_zaya.py", description="Pretrain a ZAYA1-style MoE model.",
                                allow_abbrev=False)
    p.add_argument("--config", help="YAML file of flags (command-line flags override it)")
    g = p.add_argument_group("model")
    g.add_argument("--preset", default="zaya1-tiny", help=f"model preset: {', '.join(sorted(PRESETS))}")
    for name, kind in MODEL_FLAGS.items():
        g.add_argument("--" + name.replace("_", "-"), type=kind, default=None)
    g.add_argument("--untie-embeddings-and-output-weights", action="store_true", default=None)
    g = p.add_argument_group("parallelism")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--context-parallel-size", type=int, default=1)
    g.add_argument("--expert-model-parallel-size", type=int, default=1)
    g.add_argument("--sequence-parallel", action="store_true")
    g.add_argument("--use-distributed-optimizer", action="store_true")
    g.add_argument("--distributed-backend", choices=["nccl", "gloo"], default=None)
    g = p.add_argument_group("batch and schedule")
    g.add_argument("--micro-batch-size", type=int, default=4)
    g.add_argument("--global-batch-size", type=int, default=16)
    g.add_argument("--rampup-batch-size", type=int, nargs=3, default=None, metavar=("START", "INCR", "SAMPLES"))
    g.add_argument("--train-iters", type=int, default=None)
    g.add_argument("--train-samples", type=int, default=None)
    g.add_argument("--optimizer", choices=["muon", "adamw"], default="muon")
    g.add_argument("--lr", type=float, default=3e-4)
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--lr-decay-iters", type=int, default=None)
    g.add_argument("--lr-decay-style", choices=DECAY_STYLES, default="cosine")
    g.add_argument("--lr-wsd-decay-iters", type=int, default=0)
    g.add_argument("--lr-wsd-decay-style", choices=WSD_DECAY_STYLES, default="linear")
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.95)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--muon-momentum", type=float, default=0.95)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--bf16", action="store_true")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--moe-router-bias-lr", type=float, default=1e-2)
    g.add_argument("--moe-router-bias-beta1", type=float, default=0.9)
    g.add_argument("--moe-router-bias-beta2", type=float, default=0.999)
    g.add_argument("--no-moe-router-bias-update", action="store_true")
    g = p.add_argument_group("data")
    g.add_argument("--data-path", nargs="+", default=None)
    g.add_argument("--split", default="969,30,1")
    g.add_argument("--tokenizer-type", default="GPTSentencePieceTokenizer")
    g.add_argument("--tokenizer-model", default=None)
    g.add_argument("--data-cache-path", default=None)
    g.add_argument("--num-workers", type=int, default=2)
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
    g.add_argument("--no-load-rng", action="store_true")
    g.add_argument("--finetune", action="store_true")
    g = p.add_argument_group("logging and exits")
    g.add_argument("--log-interval", type=int, default=10)
    g.add_argument("--eval-interval", type=int, default=1000)
    g.add_argument("--eval-iters", type=int, default=10)
    g.add_argument("--tensorboard-dir", default=None)
    g.add_argument("--progress-bar", action="store_true", help="tqdm progress bar (short local runs)")
    g.add_argument("--peak-tflops", type=float, default=None, help="per-device peak for MFU (default: table/measured)")
    g.add_argument("--exit-interval", type=int, default=None)
    g.add_argument("--exit-duration-in-mins", type=float, default=None)
    return p


def _apply_yaml_defaults(parser: argparse.ArgumentParser, path: str) -> None:
    if not os.path.isfile(path):
        parser.error(f"--config {path}: file not found")
    try:
        with open(path) as f:
            values = yaml.safe_load(f) or {}
    except yaml.YAMLError as err:
        parser.error(f"--config {path}: not valid YAML ({err})")
    if not isinstance(values, dict):
        parser.error(f"--config {path}: expected a mapping of flag names to values")
    known = {a.dest for a in parser._actions}
    defaults = {}
    for key, value in values.items():
        dest = str(key).lstrip("-").replace("-", "_")
        if dest not in known or dest == "config":
            parser.error(f"--config {path}: unknown key {key!r}")
        defaults[dest] = value
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


def validate(args: argparse.Namespace) -> RunConfig:
    """All cross-flag checks; raises ValueError naming the flag."""
    overrides = {name: getattr(args, name) for name in MODEL_FLAGS if getattr(args, name) is not None}
    if args.untie_embeddings_and_output_weights:
        overrides["untie_embeddings_and_output_weights"] = True
    model = model_config_from_preset(args.preset, **overrides)

    parallel = ParallelSizes(world_size_from_env(), args.tensor_model_parallel_size, args.context_parallel_size,
                             args.expert_model_parallel_size, args.sequence_parallel, args.use_distributed_optimizer)
    tp, cp = parallel.tensor_model_parallel_size, parallel.context_parallel_size
    check_layout(parallel.world_size, tp, cp, parallel.expert_model_parallel_size, model)
    if cp > 1 and model.seq_length % (2 * cp):
        raise ValueError(f"--seq-length={model.seq_length} must be divisible by 2 x --context-parallel-size={cp}")

    if (args.train_iters is None) == (args.train_samples is None):
        raise ValueError("give exactly one of --train-iters and --train-samples")
    for flag in ("micro_batch_size", "global_batch_size", "log_interval", "eval_interval"):
        if getattr(args, flag) <= 0:
            raise ValueError(f"--{flag.replace('_', '-')}={getattr(args, flag)}: must be positive")
    schedule = BatchSizeSchedule(args.global_batch_size, args.micro_batch_size, parallel.data_parallel_size,
                                 args.rampup_batch_size)
    total_iters = args.train_iters or schedule.iterations_for_samples(args.train_samples)
    if total_iters <= 0:
        raise ValueError(f"--train-samples={args.train_samples} is less than one global batch: no iteration to run")
    LRSchedule(args.lr, args.min_lr, args.lr_warmup_iters, args.lr_decay_iters or total_iters, args.lr_decay_style,
               args.lr_wsd_decay_iters, args.lr_wsd_decay_style)

    from megatron_zaya.data import DataConfig
    if not args.data_path:
        raise ValueError("--data-path is required")
    for token in args.data_path:
        try:
            float(token)
            continue   # a blend weight
        except ValueError:
            pass
        for ext in (".bin", ".idx"):
            if not os.path.isfile(token + ext):
                raise ValueError(f"--data-path {token}: {token + ext} not found")
    if args.tokenizer_model and not os.path.exists(args.tokenizer_model):
        raise ValueError(f"--tokenizer-model {args.tokenizer_model}: not found")
    if args.save_interval is not None and args.save_interval <= 0:
        raise ValueError(f"--save-interval={args.save_interval}: must be positive")
    if args.save:
        parent = os.path.dirname(os.path.abspath(args.save))
        if not os.access(parent if not os.path.exists(args.save) else args.save, os.W_OK):
            raise ValueError(f"--save {args.save}: not writable")
    data = DataConfig(data_path=args.data_path, split=args.split, data_cache_path=args.data_cache_path,
                      seed=args.seed, num_workers=args.num_workers, reset_position_ids=args.reset_position_ids,
                      reset_attention_mask=args.reset_attention_mask, eod_mask_loss=args.eod_mask_loss,
                      tokenizer_type=args.tokenizer_type, tokenizer_model=args.tokenizer_model)

    train_fields = {f.name for f in fields(TrainConfig)}
    train = TrainConfig(**{k: v for k, v in vars(args).items() if k in train_fields})
    train.moe_router_bias_update = not args.no_moe_router_bias_update
    optim = OptimizerConfig(optimizer=args.optimizer, lr=args.lr, weight_decay=args.weight_decay,
                            adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
                            muon_momentum=args.muon_momentum, clip_grad=args.clip_grad)
    return RunConfig(model, train, optim, parallel, data, args)
