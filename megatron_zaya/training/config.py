"""TrainConfig: batch sizes, iteration budget, schedule, precision, logging and checkpoint flags."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TrainConfig:
    micro_batch_size: int = 4
    global_batch_size: int = 16
    rampup_batch_size: list[int] | None = None     # [start, increment, ramp samples]
    train_iters: int | None = None
    train_samples: int | None = None
    # schedule
    lr_warmup_iters: int = 0
    lr_decay_iters: int | None = None
    lr_decay_style: str = "cosine"
    lr_wsd_decay_iters: int = 0
    lr_wsd_decay_style: str = "exponential"     # Megatron-LM's default
    lr_warmup_samples: int = 0                     # the --lr-*-samples flags go with --train-samples
    lr_decay_samples: int | None = None
    lr_wsd_decay_samples: int = 0
    lr_warmup_fraction: float | None = None        # of the decay length, in either unit
    lr_warmup_init: float = 0.0
    # weight decay schedule (Megatron's --weight-decay-incr-style; constant: --weight-decay throughout)
    weight_decay_incr_style: str = "constant"
    start_weight_decay: float | None = None
    end_weight_decay: float | None = None
    min_lr: float = 0.0
    decoupled_lr: float | None = None              # the embedding / output layer's own peak and floor
    decoupled_min_lr: float | None = None
    # precision and seed
    bf16: bool = False
    seed: int = 1234
    # router balancing biases
    moe_router_bias_update: bool = True
    moe_router_bias_lr: float = 1e-2
    moe_router_bias_beta1: float = 0.9
    moe_router_bias_beta2: float = 0.999
    moe_router_bias_eps: float = 1e-8
    moe_router_skip_target: float | None = None   # share of tokens steered to the skip class (balancing.py)
    # evaluation and logging
    log_interval: int = 100
    eval_interval: int = 1000
    eval_iters: int = 100
    tensorboard_dir: str | None = None
    tensorboard_log_interval: int = 1
    tensorboard_queue_size: int = 1000
    progress_bar: bool = False
    log_num_zeros_in_grad: bool = False
    log_params_norm: bool = False                  # also on the console line (TensorBoard always has it)
    peak_tflops: float | None = None
    log_straggler: bool = False                    # training/stragglers.py
    log_progress: bool = False                     # training/progress_log.py: --save/progress.txt
    straggler_minmax_count: int = 1
    check_weight_hash_across_dp_replicas_interval: int | None = None   # Trainer: runtime.check_replicas_equal
    # activation recomputation (ZayaModel.set_recompute)
    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    recompute_modules: list[str] | None = None   # selective: Megatron's module names (model/recompute.py)
    # exits
    exit_interval: int | None = None
    exit_duration_in_mins: float | None = None
    # Python garbage collection (--manual-gc): off during training, collected every N iterations
    manual_gc: bool = False
    manual_gc_interval: int = 0
    manual_gc_eval: bool = True          # with manual_gc: collect at the start and end of each evaluation
    empty_unused_memory_level: int = 0             # GPU: torch.cuda.empty_cache after backward (1) / optimizer (2)
    # profiling (megatron_zaya/training/profiling.py)
    profile: bool = False
    use_pytorch_profiler: bool = False
    profile_step_start: int = 10
    profile_step_end: int = 12
    profile_ranks: list[int] = field(default_factory=lambda: [0])
    pytorch_profiler_collect_shapes: bool = False
    pytorch_profiler_collect_callstack: bool = False
    record_memory_history: bool = False
    memory_snapshot_path: str = "snapshot.pickle"
    # checkpoints
    save: str | None = None
    load: str | None = None                # with --ckpt-step: that iteration's folder (arguments.validate)
    ckpt_step: int | None = None           # --ckpt-step as given (errors name it; load holds its folder)
    exit_on_missing_checkpoint: bool = False
    skip_train: bool = False                  # evaluate the loaded model only (Megatron-LM's --skip-train)
    dry_run: bool = False                     # every check and the start-up summary, then exit (no model)
    iterations_to_skip: list[int] | None = None   # --iterations-to-skip: completed-iteration counts (Megatron's)
    deterministic_mode: bool = False          # --deterministic-mode: torch's deterministic algorithms
    moe_router_force_load_balancing: bool = False   # benchmarks: balanced routing (ZayaModel.set_force_load_balancing)
    pretrained_checkpoint: str | None = None   # fine-tuned from when --load holds no checkpoint (Megatron-LM)
    save_interval: int | None = None
    non_persistent_save_interval: int | None = None   # kept in --save until a newer checkpoint is complete
    use_checkpoint_opt_param_scheduler: bool = False   # the schedules from the loaded checkpoint's flags
    ckpt_keep: int | None = None
    save_retain_interval: int | None = None   # Megatron-LM's: keep checkpoints at its multiples (and the newest)
    async_save: bool = False
    no_load_optim: bool = False
    no_save_optim: bool = False
    no_save_rng: bool = False
    no_load_rng: bool = False
    finetune: bool = False
    # fault tolerance
    max_consecutive_nonfinite: int = 3
    watchdog_timeout_factor: float = 20.0
    watchdog_min_seconds: float = 600.0
    watchdog_first_iteration_seconds: float = 1800.0   # startup allowance: compilation, first collectives
    watchdog_pause_seconds: float = 7200.0    # the longest evaluation or checkpoint save (0: no limit)
    extra: dict = field(default_factory=dict)
