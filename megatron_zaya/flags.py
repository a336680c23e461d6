"""The parser of pretrain_zaya.py: Megatron-LM's flag names in groups, and `--config FILE.yaml`,
whose keys (spelled like the flags, with dashes or underscores) become the parser's defaults, so
command-line flags win. Values are converted and range-checked later, in arguments.validate.
"""
from __future__ import annotations

import argparse
import os
import warnings

import yaml

from megatron_zaya.config import PRESETS
from megatron_zaya.data.tokenizer import add_tiktoken_arguments
from megatron_zaya.megatron_flags import add_megatron_flags
from megatron_zaya.optim.builder import MUON_TP_MODES
from megatron_zaya.optim.muon import MUON_SCALE_MODES
from megatron_zaya.optim.schedules import DECAY_STYLES, WD_INCR_STYLES, WSD_DECAY_STYLES
from megatron_zaya.parallel.launch import DEFAULT_TIMEOUT_MINUTES, detect_launcher
from megatron_zaya.training.config import TrainConfig

DEFAULT_PRESET = "zaya1-tiny"
MODEL_FLAGS = {  # flag -> type; None means "keep the preset's value"
    "num_layers": int, "hidden_size": int, "num_attention_heads": int, "num_query_groups": int,
    "kv_channels": int, "seq_length": int, "max_position_embeddings": int, "rotary_base": float,
    "rotary_percent": float, "norm_epsilon": float, "num_experts": int, "moe_router_topk": int,
    "moe_ffn_hidden_size": int, "router_hidden_size": int, "make_vocab_size_divisible_by": int,
    "init_method_std": float, "embedding_init_method_std": float, "vocab_size": int,
}


# Megatron-LM switches for metrics this trainer always writes to TensorBoard under Megatron's names
# (`throughput`, the timers' `forward-backward-time`, `optimizer-time`, `batch-generator-time`, the
# `mem-*-bytes` tags, `lm loss validation ppl`, `learning-rate`, per-layer MoE statistics, `world-size`):
# accepted, so that existing launch scripts run unchanged, and otherwise ignored.
ALWAYS_LOGGED = ("--log-throughput", "--log-timers-to-tensorboard", "--log-validation-ppl-to-tensorboard",
                 "--log-memory-to-tensorboard", "--log-learning-rate-to-tensorboard",
                 "--moe-per-layer-logging", "--log-world-size-to-tensorboard")


class OneLineErrorParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line naming the flag, with exit status 2: argparse prints the
    whole usage first, hundreds of lines of Megatron-LM's flags (`--help` has them)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


class NodeLeaderParser(OneLineErrorParser):
    """An ArgumentParser that prints (help, usage, errors) on the first process of each node only (local
    rank 0) of a multi-process launch: every rank parses the same flags and would print the same
    message, once per GPU; files, which validation also checks, can differ between nodes but not
    between the processes of one node. The other ranks still exit with the same status."""

    def _print_message(self, message, file=None):
        try:
            with warnings.catch_warnings():    # its Slurm warning is for the launch, said there
                warnings.simplefilter("ignore")
                local_rank = detect_launcher().local_rank
        except (ValueError, KeyError):     # a malformed launcher environment: print rather than hide
            local_rank = 0
        if local_rank == 0:
            super()._print_message(message, file)


def add_tokenizer_arguments(group, default_type: str | None) -> None:
    """The tokenizer flags (--tokenizer-type `default_type`), for pretrain_zaya.py and the tools that size the
    model's vocabulary as it does (model_vocab.py); TikTokenizer's size is --vocab-size (see validate)."""
    group.add_argument("--tokenizer-type", default=default_type)
    group.add_argument("--tokenizer-model", default=None)
    group.add_argument("--vocab-file", default=None, help="GPT2BPETokenizer: GPT-2's vocab.json")
    group.add_argument("--merge-file", default=None, help="GPT2BPETokenizer: GPT-2's merges.txt")
    add_tiktoken_arguments(group, vocab_size_flag=False)


def build_parser() -> argparse.ArgumentParser:
    p = NodeLeaderParser(prog="pretrain_zaya.py", description="Pretrain a ZAYA1-style MoE model.",
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
    g.add_argument("--ddp-bucket-size", type=int, default=None,
                   help="elements per gradient bucket (default 40M); a bucket's all-reduce (reduce-scatter under "
                        "ZeRO-1) starts as soon as its last gradient is ready, overlapping the rest of the backward")
    g.add_argument("--ddp-num-buckets", type=int, default=None,
                   help="instead of --ddp-bucket-size: about this many buckets, each 1/N of the gradient elements "
                        "a rank holds (dense, sequence-parallel and expert gradients are bucketed apart)")
    g.add_argument("--distributed-backend", choices=["nccl", "gloo"], default=None)
    g.add_argument("--distributed-timeout-minutes", type=float, default=DEFAULT_TIMEOUT_MINUTES,
                   help="how long a collective may wait before the process group gives up")
    g = p.add_argument_group("batch and schedule")
    g.add_argument("--micro-batch-size", type=int, default=4)
    g.add_argument("--global-batch-size", type=int, default=None,
                   help="sequences per iteration (default: --micro-batch-size x data-parallel size, as in Megatron-LM)")
    g.add_argument("--rampup-batch-size", type=int, nargs=3, default=None, metavar=("START", "INCR", "SAMPLES"))
    g.add_argument("--decrease-batch-size-if-needed", action="store_true",
                   help="when --micro-batch-size x data-parallel size does not divide --global-batch-size (fewer "
                        "healthy GPUs after a restart), train with the largest multiple below it instead of stopping "
                        "(as in Megatron-LM); the next start with a fitting layout uses the full size again")
    g.add_argument("--train-iters", type=int, default=None)
    g.add_argument("--train-samples", type=int, default=None)
    g.add_argument("--optimizer", choices=["muon", "adamw", "adam"], default="muon",
                   help="muon (Muon on hidden matrices, AdamW on the rest) or adamw; Megatron-LM's adam is its "
                        "AdamW (decoupled weight decay), so adam means adamw here")
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
    g.add_argument("--lr-wsd-decay-style", choices=WSD_DECAY_STYLES, default="exponential",
                   help="WSD's final decay (default exponential, as in Megatron-LM)")
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
    g.add_argument("--muon-scale-mode", choices=MUON_SCALE_MODES, default="spectral",
                   help="scale of the orthogonalised (out, in) update: spectral sqrt(max(out, in)), unit_rms_norm "
                        "sqrt(out / in), shape_scaling sqrt(max(1, out / in)); times --muon-extra-scale-factor")
    g.add_argument("--muon-extra-scale-factor", type=float, default=0.2,
                   help="0.2 with spectral (the default) matches the update's RMS to AdamW's (ZAYA1); "
                        "Megatron-LM's default is 1.0")
    g.add_argument("--muon-use-nesterov", action="store_true",
                   help="accepted: Muon's momentum is always Nesterov here (Megatron-LM's default is plain)")
    g.add_argument("--muon-no-split-qkv", action="store_true",
                   help="accepted: CCA's query, key and value projections are separate matrices, each its own "
                        "Muon matrix")
    g.add_argument("--muon-fp32-matmul-prec", choices=["low", "medium", "high"], default=None,
                   help="accepted: Newton-Schulz runs in bf16 where bf16 matmuls are native, else in full fp32")
    g.add_argument("--moe-router-force-load-balancing", action="store_true",
                   help="benchmarks only: every router sends token i to expert i mod E (an exactly balanced "
                        "load, no skip) whatever it learned; i counts the tokens of the rank's micro-batch, so "
                        "under CP or SP, where a rank's tokens are not a multiple of E, the split differs from one "
                        "process's; the run warns (as in Megatron-LM)")
    g.add_argument("--disable-bf16-reduced-precision-matmul", action="store_true",
                   help="on CUDA, bf16 matmuls accumulate without reduced-precision reductions "
                        "(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False; as in Megatron-LM)")
    g.add_argument("--deterministic-mode", action="store_true",
                   help="torch.use_deterministic_algorithms: repeatable steps on GPUs too, usually slower; an op "
                        "without a deterministic kernel stops the run naming it (as in Megatron-LM)")
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
    g.add_argument("--recompute-modules", nargs="+", default=None, metavar="MODULE",
                   help="with --recompute-granularity selective, Megatron-LM's names of the pieces recomputed: "
                        "layernorm (norm internals), core_attn (QK-norm, RoPE, a math-path attention core and a "
                        "segmented conv), "
                        "moe_act (router GELU and expert SwiGLU outputs), moe (the whole MoE sublayer runs again "
                        "in the backward); default: layernorm core_attn moe_act")
    g.add_argument("--moe-layer-recompute", action="store_true",
                   help="Megatron-LM's older switch for --recompute-granularity selective --recompute-modules moe")
    g.add_argument("--moe-router-bias-lr", type=float, default=None,
                   help="lr of the Adam that moves the balancing biases (default 1e-2)")
    g.add_argument("--moe-router-bias-beta1", type=float, default=0.9)
    g.add_argument("--moe-router-bias-beta2", type=float, default=0.999)
    g.add_argument("--moe-router-bias-eps", type=float, default=1e-8,
                   help="eps of that Adam: the smallest error it still scales to a full lr step")
    g.add_argument("--moe-router-skip-target", type=float, default=None,
                   help="share of tokens the balancing steers to the skip class (no expert compute for them): "
                        "the skip class is balanced with the experts, their biases moving against its -1. Default: "
                        "the skip class is left out, and from scratch it is never chosen (optim/balancing.py)")
    g.add_argument("--no-moe-router-bias-update", action="store_true")
    g = p.add_argument_group("data")
    g.add_argument("--data-path", nargs="+", default=None)
    g.add_argument("--mock-data", action="store_true",
                   help="random tokens instead of a dataset (no files; try a model or layout, or benchmark)")
    for split in ("train", "valid", "test"):
        g.add_argument(f"--{split}-data-path", nargs="+", default=None,
                       help=f"instead of --data-path and --split: the {split} blend (every document in it)")
    g.add_argument("--data-args-path", default=None,
                   help="a file holding the --data-path blend (weights and prefixes, whitespace-separated), for "
                        "blends too long for a command line (as in Megatron-LM)")
    g.add_argument("--per-split-data-args-path", default=None,
                   help="a JSON file {\"train\": blend, \"valid\": blend, \"test\": blend} instead of "
                        "--train/valid/test-data-path (each blend a list or a whitespace-separated string)")
    g.add_argument("--split", default="969,30,1")
    add_tokenizer_arguments(g, "GPTSentencePieceTokenizer")
    g.add_argument("--data-cache-path", default=None)
    g.add_argument("--mid-level-dataset-surplus", type=float, default=0.005,
                   help="extra share of samples each blended dataset builds, so the blend never runs short")
    g.add_argument("--num-workers", type=int, default=2)
    g.add_argument("--no-mmap-bin-files", dest="mmap_bin_files", action="store_false",
                   help="read the .bin files with positional reads instead of memory-mapping them")
    g.add_argument("--reset-position-ids", action="store_true")
    g.add_argument("--reset-attention-mask", action="store_true")
    g.add_argument("--eod-mask-loss", action="store_true")
    g = p.add_argument_group("checkpoints")
    g.add_argument("--save", default=None)
    g.add_argument("--load", default=None)
    g.add_argument("--ckpt-step", type=int, default=None,
                   help="load this iteration's checkpoint from --load instead of the latest (no fallback)")
    g.add_argument("--pretrained-checkpoint", default=None,
                   help="when --load holds no checkpoint (yet): start from this one as --finetune does (its "
                        "weights, iteration 0, fresh optimizer); later restarts resume from --load (as in Megatron-LM)")
    g.add_argument("--exit-on-missing-checkpoint", action="store_true",
                   help="stop when --load holds no checkpoint, instead of training from scratch")
    g.add_argument("--save-interval", "--persistent-save-interval", type=int, default=None)
    g.add_argument("--non-persistent-save-interval", type=int, default=None,
                   help="also save every N iterations a checkpoint that is deleted once a newer one is complete "
                        "(between --save-interval saves: less work lost to a crash, no more disk)")
    g.add_argument("--non-persistent-ckpt-type", default=None, choices=("global", "local", "in_memory"),
                   help="global (the default here): non-persistent checkpoints written into --save like the others")
    g.add_argument("--non-persistent-global-ckpt-dir", default=None,
                   help="accepted when it is --save: non-persistent checkpoints are kept in --save")
    g.add_argument("--ckpt-keep", type=int, default=None, help="keep the newest N checkpoints, remove older ones")
    g.add_argument("--save-retain-interval", type=int, default=None,
                   help="keep the checkpoints at multiples of N iterations (a multiple of --save-interval) and "
                        "the newest; the others from this run's start on go once a newer one is complete (as in "
                        "Megatron-LM); with --ckpt-keep a checkpoint either rule keeps stays")
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
    g.add_argument("--no-use-tokenizer-model-from-checkpoint-args", action="store_false",
                   dest="use_tokenizer_model_from_checkpoint_args",
                   help="with --use-checkpoint-args and no --tokenizer-model: do not take the saving run's "
                        "tokenizer flags (as in Megatron-LM)")
    g.add_argument("--use-mp-args-from-checkpoint-args", action="store_true",
                   help="with --use-checkpoint-args: also the tensor-parallel size of the run that saved the "
                        "checkpoint (as in Megatron-LM; any layout loads a checkpoint, this one avoids resharding)")
    g.add_argument("--use-checkpoint-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler", action="store_true",
                   help="the LR and weight-decay schedules from the flags of the run that saved --load's "
                        "checkpoint, not from this run's (as in Megatron-LM)")
    g = p.add_argument_group("logging and exits")
    g.add_argument("--log-interval", type=int, default=100,
                   help="iterations per console line (Megatron-LM's default, 100)")
    g.add_argument("--iterations-to-skip", nargs="+", type=int, default=None, metavar="N",
                   help="the steps after N completed iterations (Megatron-LM's numbering: N skips the step logged "
                        "as iteration N + 1; 0 the first) whose global batch is read and dropped: no forward, "
                        "backward or update, e.g. the batches of a loss spike")
    g.add_argument("--eval-interval", type=int, default=1000)
    g.add_argument("--eval-iters", type=int, default=100,
                   help="validation iterations (global batches) per evaluation (Megatron-LM's default, 100)")
    g.add_argument("--full-validation", action="store_true",
                   help="each evaluation reads its validation set(s) whole, every sample once, instead of "
                        "--eval-iters global batches (as in Megatron-LM)")
    g.add_argument("--multiple-validation-sets", action="store_true",
                   help="evaluate each dataset of the validation split on its own: TensorBoard 'lm loss "
                        "validation NAME' per dataset (its file name), 'lm loss validation' their mean; "
                        "--valid-data-path without weights (as in Megatron-LM)")
    g.add_argument("--skip-train", action="store_true",
                   help="no training: evaluate the model --load (or --pretrained-checkpoint) gives on --eval-iters "
                        "validation batches, save nothing (as in Megatron-LM)")
    g.add_argument("--dry-run", action="store_true",
                   help="make every check a run makes before its first step (flags, layout against WORLD_SIZE, data "
                        "and tokenizer, --load / --save, the data indices, which are cached for the real run), print "
                        "the start-up summary (model, layout, batch, passes over each dataset) and exit: nothing is "
                        "built or trained (e.g. on a login node, before a job waits in the queue)")
    g.add_argument("--tensorboard-dir", default=None)
    g.add_argument("--tensorboard-log-interval", type=int, default=1,
                   help="write TensorBoard scalars every N iterations (the console line: --log-interval)")
    g.add_argument("--tensorboard-queue-size", type=int, default=1000,
                   help="TensorBoard events buffered before a write to disk")
    for flag in ALWAYS_LOGGED:
        g.add_argument(flag, action="store_true", help="accepted for Megatron-LM scripts: always logged here")
    g.add_argument("--log-params-norm", action="store_true",
                   help="the parameters' norm on the console line too (TensorBoard's 'params-norm' is always written)")
    g.add_argument("--progress-bar", action="store_true",
                   help="tqdm progress bar on a terminal (short local runs; not drawn when stderr is a file or pipe)")
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
    g.add_argument("--check-weight-hash-across-dp-replicas-interval", type=int, default=None,
                   help="every N iterations, stop the run if the data-parallel replicas' weights differ "
                        "(a SHA-256 of each rank's weights, compared within each replica group)")
    g.add_argument("--logging-level", type=int, default=None,
                   help="level of Python's root logger (10 DEBUG, 20 INFO, 30 WARNING, ...)")
    g.add_argument("--peak-tflops", type=float, default=None, help="per-device peak for MFU (default: table/measured)")
    g.add_argument("--exit-interval", type=int, default=None)
    g.add_argument("--exit-duration-in-mins", type=float, default=None)
    g.add_argument("--manual-gc", action="store_true",
                   help="turn Python's automatic garbage collection off (its pauses differ between ranks and "
                        "stall collectives); collect every --manual-gc-interval iterations instead")
    g.add_argument("--manual-gc-interval", type=int, default=0, help="with --manual-gc: 0 never collects")
    g.add_argument("--no-manual-gc-eval", dest="manual_gc_eval", action="store_false",
                   help="with --manual-gc: no collection at the start and end of each evaluation (as in Megatron-LM)")
    g.add_argument("--empty-unused-memory-level", type=int, default=0, choices=(0, 1, 2),
                   help="GPU: return the allocator's unused blocks after forward+backward (1), and after the "
                        "optimizer step too (2), against fragmentation (as in Megatron-LM)")
    g = p.add_argument_group("fault tolerance (docs/CHECKPOINTING.md)")
    g.add_argument("--max-consecutive-nonfinite", type=int, default=TrainConfig.max_consecutive_nonfinite,
                   help="non-finite steps in a row (each skipped) that stop the run with NonFiniteLossError")
    g.add_argument("--watchdog-timeout-factor", type=float, default=TrainConfig.watchdog_timeout_factor,
                   help="a rank whose iteration takes this many times the median iteration time (and at least "
                        "--watchdog-min-seconds) prints every thread's stack and exits with code 124")
    g.add_argument("--watchdog-min-seconds", type=float, default=TrainConfig.watchdog_min_seconds,
                   help="the watchdog's shortest timeout")
    g.add_argument("--watchdog-first-iteration-seconds", type=float,
                   default=TrainConfig.watchdog_first_iteration_seconds,
                   help="the first iteration's allowance (compilation, first collectives; at least "
                        "--watchdog-min-seconds)")
    g.add_argument("--watchdog-pause-seconds", type=float, default=TrainConfig.watchdog_pause_seconds,
                   help="the longest an evaluation or checkpoint save may run before the watchdog prints every "
                        "thread's stack and exits with code 124 (a stalled file system, a hung peer); 0: no limit")
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
    """One word through the flag's argparse `type` and `choices`, as on a command line, where the shell makes a
    word starting with ~ a home folder's path (`save: ~/ckpt` was a folder named "~" in the working folder)."""
    if word.startswith("~"):
        word = os.path.expanduser(word)
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


def _yaml_value(parser: argparse.ArgumentParser, path: str, key, action: argparse.Action, value,
                names_setting: bool = False):
    """A YAML value converted exactly as argparse converts the same flag on the command line;
    anything argparse would reject stops with one line naming the file, the key and the value.
    `names_setting`: the key is the flag's dest, not the flag (`mmap-bin-files: false` for the flag
    --no-mmap-bin-files): an on/off value is the setting itself."""
    if isinstance(action, argparse._StoreConstAction):        # store_true / store_false
        if not isinstance(value, bool):
            _yaml_error(parser, path, key, f"is an on/off flag: give true or false, not {value!r}")
        if names_setting and isinstance(action.const, bool):
            return value
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


def apply_training_config(parser: argparse.ArgumentParser, argv, unused: str) -> dict | None:
    """For another tool (the planner, model_stats) that takes a training config as --config FILE.yaml: the
    file's keys that name the tool's flags become its defaults; the keys of training flags it has no use
    for are left out, listed on stderr ("left out" after `unused`) and returned {key: value}; any other
    key stops it (apply_yaml_defaults). Without --config in argv: None."""
    import sys
    path = parser.parse_known_args(argv)[0].config
    if not path:
        return None
    outside = frozenset(a.dest for a in build_parser()._actions) - {a.dest for a in parser._actions}
    skipped = apply_yaml_defaults(parser, path, ignore=outside)
    if skipped:
        print(f"--config {path}: {unused}, left out: {', '.join(map(str, skipped))}", file=sys.stderr)
    return skipped


class _WordLoader(yaml.SafeLoader):
    """YAML whose plain numbers (and dates) stay the words they are written as, for argparse to convert
    as it converts them on a command line: YAML 1.1 reads `0777` as 511 and `1:30` as 90. A key given
    twice in one mapping is an error (PyYAML would keep the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in getattr(node, "value", []):
            if key_node.tag == "tag:yaml.org,2002:merge":      # `<<: *anchor`: its keys may be overridden here
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)):
                continue          # (an unhashable key: the base class names it)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


_WordLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers
            if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def apply_yaml_defaults(parser: argparse.ArgumentParser, path: str, ignore=frozenset()) -> dict:
    """Make the keys of the YAML file `path` the parser's defaults (so command-line flags win). A key
    names a flag (dashes or underscores, without the leading --) or its dest; keys whose dest is in
    `ignore` are skipped (another tool's flags: the planner reads a training config) and returned with
    their values."""
    if not os.path.isfile(path):
        parser.error(f"--config {path}: file not found")
    try:
        with open(path, encoding="utf-8") as f:
            values = yaml.load(f, Loader=_WordLoader) or {}
    except yaml.YAMLError as err:
        parser.error(f"--config {path}: not valid YAML ({' '.join(str(err).split())})")     # on one line
    except UnicodeDecodeError as err:
        parser.error(f"--config {path}: not UTF-8 text (byte {err.start}: {err.reason}); is it the YAML file?")
    except OSError as err:
        parser.error(f"--config {path}: cannot be read ({err.strerror or err})")
    if not isinstance(values, dict):
        parser.error(f"--config {path}: expected a mapping of flag names to values")
    actions = {a.dest: a for a in parser._actions if not isinstance(a, argparse._HelpAction)}
    by_flag = {option: a for a in actions.values() for option in a.option_strings}
    defaults, skipped, key_of = {}, {}, {}
    for key, value in values.items():
        dest = str(key).lstrip("-").replace("-", "_")
        flag = by_flag.get("--" + dest.replace("_", "-"))
        action = flag or actions.get(dest)
        if action is None and dest in ignore:
            skipped[str(key)] = value
            continue
        if action is None or action.dest == "config":
            parser.error(f"--config {path}: unknown key {key!r}")
        if action.dest in key_of:      # `train-iters` and `train_iters`, or a flag and its alias
            setting = action.option_strings[0] if action.option_strings else action.dest
            parser.error(f"--config {path}: keys {key_of[action.dest]!r} and {key!r} both set {setting}")
        key_of[action.dest] = key
        defaults[action.dest] = _yaml_value(parser, path, key, action, value, names_setting=flag is None)
        if isinstance(action, argparse._StoreTrueAction) and defaults[action.dest] is True:
            _add_off_switch(parser, action)
    parser.set_defaults(**defaults)
    return skipped


def _add_off_switch(parser: argparse.ArgumentParser, action: argparse.Action) -> None:
    """--no-FLAG for an on/off flag the --config file turned on, so that the command line can turn it off
    again (`bf16: true` in the file, --no-bf16 for one run), unless the parser has that name already."""
    name = "--no-" + action.option_strings[0].lstrip("-")
    if name not in parser._option_string_actions:
        parser.add_argument(name, dest=action.dest, action="store_false",
                            help=f"turn {action.option_strings[0]} off (set by --config)")


# Settings that are alternatives of each other: the command line choosing one (--train-samples) sets
# aside a --config file's other (train-iters), as a file's value gives way to the command line's. A choice
# of several settings taken together is a tuple (the per-split blends).
ALTERNATIVES = (("train_iters", "train_samples"), ("lr_warmup_iters", "lr_warmup_samples", "lr_warmup_fraction"),
                ("lr_decay_iters", "lr_decay_samples"), ("lr_wsd_decay_iters", "lr_wsd_decay_samples"),
                ("ddp_bucket_size", "ddp_num_buckets"),
                ("data_path", "mock_data", ("train_data_path", "valid_data_path", "test_data_path"), "data_args_path",
                 "per_split_data_args_path"),
                ("moe_router_bias_lr", "moe_router_bias_update_rate"))      # our name and Megatron-LM's


def command_line_dests(argv, make_parser=None) -> set[str]:
    """The dests the command line `argv` itself sets (a --config file's keys, parser defaults, are not among them),
    parsed by `make_parser()` (a tool's parser; pretrain_zaya.py's by default)."""
    plain = (make_parser or build_parser)()
    for action in plain._actions:        # a dest is in the namespace only when its flag is on the command line
        action.default, action.required = argparse.SUPPRESS, False
    return set(vars(plain.parse_known_args(argv)[0]))


def let_the_command_line_win(args: argparse.Namespace, argv) -> None:
    """After a parse with --config defaults: for each group of ALTERNATIVES of which the command line sets
    one, the others go back to their plain defaults (the file's values set aside)."""
    defaults = {a.dest: a.default for a in build_parser()._actions}
    given = command_line_dests(argv)
    for group in ALTERNATIVES:
        choices = [choice if isinstance(choice, tuple) else (choice,) for choice in group]
        if any(given & set(choice) for choice in choices):
            for choice in choices:
                if not given & set(choice):
                    for dest in choice:
                        setattr(args, dest, defaults[dest])
