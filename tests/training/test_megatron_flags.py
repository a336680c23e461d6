"""Megatron-LM launch scripts' flags in pretrain_zaya.py: a whole script's worth accepted unchanged (the
switches this code always satisfies, ZAYA1's architecture values, the ones that take effect), and the
aliases that fold into this code's settings. Refused values are in test_arguments.py's table."""
import pytest

from megatron_zaya.arguments import parse_args
from tests.training.helpers import tiny_run_flags
from tests.training.test_arguments import error_of


def test_a_megatron_lm_script_runs_unchanged(tiny_corpus, tmp_path):
    """The flags a Megatron-LM GPT / MoE launch script carries: implementation switches are accepted
    (this code always does what they ask), architecture flags with ZAYA1's values too, and the ones
    that do something here take effect."""
    megatron = ["--use-mcore-models", "--use-flash-attn", "--transformer-impl", "transformer_engine",
                "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--swiglu", "--disable-bias-linear",
                "--group-query-attention", "--attention-dropout", "0.0", "--hidden-dropout", "0",
                "--attention-softmax-in-fp32", "--accumulate-allreduce-grads-in-fp32", "--overlap-grad-reduce",
                "--overlap-param-gather", "--moe-grouped-gemm", "--moe-token-dispatcher-type", "alltoall",
                "--moe-router-load-balancing-type", "none", "--moe-aux-loss-coeff", "0", "--moe-router-dtype", "fp32",
                "--moe-router-enable-expert-bias", "--pipeline-model-parallel-size", "1", "--ckpt-format", "torch_dist",
                "--cross-entropy-loss-fusion", "--calculate-per-token-loss", "--exit-signal-handler",
                "--override-opt_param-scheduler", "--dataloader-type", "single",
                "--recompute-activations", "--lr-warmup-init", "1e-4", "--manual-gc", "--manual-gc-interval", "5",
                "--distributed-timeout-minutes", "20", "--moe-permute-fusion", "--moe-router-pre-softmax",
                "--moe-layer-freq", "1", "--moe-router-score-function", "softmax", "--attention-backend", "auto",
                "--no-create-attention-mask-in-dataloader", "--timing-log-level", "0", "--use-dist-ckpt",
                "--main-grads-dtype", "fp32", "--use-precision-aware-optimizer", "--cp-comm-type", "p2p", "a2a",
                "--expert-tensor-parallel-size", "1", "--check-for-nan-in-loss-and-grad", "--no-position-embedding",
                "--no-async-tensor-model-parallel-allreduce", "--no-ckpt-fully-parallel-save", "--moe-per-layer-logging",
                "--log-loss-scale-to-tensorboard", "--cross-entropy-fusion-impl", "te", "--dist-ckpt-strictness",
                "log_all", "--rerun-mode", "disabled", "--te-rng-tracker", "--ddp-average-in-collective",
                "--no-manual-gc-eval", "--moe-use-legacy-grouped-gemm", "--exit-signal", "SIGTERM",
                "--num-dataset-builder-threads", "8", "--mid-level-dataset-surplus", "0.01",
                "--log-world-size-to-tensorboard", "--fp32-residual-connection", "--no-initialization",
                "--softmax-type", "vanilla", "--rope-type", "rope", "--timing-log-option", "minmax",
                "--train-sync-interval", "10", "--moe-router-fusion", "--no-align-grad-reduce",
                "--no-align-param-gather", "--disable-gloo-process-groups", "--head-lr-mult", "1.0",
                "--mtp-num-layers", "0", "--log-batch-size-to-tensorboard", "--legacy-tokenizer", "--no-one-logger",
                "--ddp-reduce-scatter-with-fp32-accumulation", "--ddp-pad-buckets-for-high-nccl-busbw",
                "--no-gradient-reduce-div-fusion", "--no-fp8-wgrad", "--no-pin-cpu-grads", "--no-pin-cpu-params",
                "--no-overlap-p2p-communication", "--no-scatter-gather-tensors-in-pipeline",
                "--overlap-param-gather-with-optimizer-step", "--no-barrier-with-level-1-timing", "--align-param-gather",
                "--no-log-learning-rate-to-tensorboard",
                "--cuda-graph-impl", "none", "--cuda-graph-scope", "attn", "moe_router", "moe_preprocess",
                "--fp8-amax-history-len", "1024",
                "--fp8-amax-compute-algo", "max", "--fp8-margin", "0", "--fp8-interval", "1",
                "--num-layers-at-start-in-bf16", "1", "--num-layers-at-end-in-bf16", "1",
                "--cpu-offloading-num-layers", "0", "--dist-ckpt-format", "torch_dist",
                "--lazy-mpu-init", "--use-tp-pp-dp-mapping", "--trust-remote-code", "--use-persistent-ckpt-worker",
                "--one-logger-async", "--mtp-loss-scaling-factor", "0.1", "--vocab-extra-ids", "0",
                "--moe-upcycling-granularity", "1", "--sgd-momentum", "0.9",
                "--nccl-communicator-config-path", "x.yaml",
                "--straggler-ctrlr-port", "65535", "--one-logger-project", "p", "--one-logger-run-name", "r",
                "--app-tag-run-name", "a", "--app-tag-run-version", "1"]
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--lr-warmup-iters": "4"}) + megatron)
    assert run.train.recompute_granularity == "selective"          # Megatron's --recompute-activations
    assert (run.train.manual_gc, run.train.manual_gc_interval, run.train.manual_gc_eval) == (True, 5, False)
    assert run.args.distributed_timeout_minutes == 20
    assert run.data.mid_level_dataset_surplus == 0.01
    from megatron_zaya.optim.schedules import lr_schedule_from_flags
    schedule = lr_schedule_from_flags(run.optim.lr, run.train, 6)
    assert schedule(0) == pytest.approx(1e-4 + (3e-3 - 1e-4) / 4)    # the warmup starts from --lr-warmup-init


def test_a_resized_preset_says_which_of_its_values_megatron_would_derive_otherwise(tiny_corpus, tmp_path):
    """--hidden-size 256 --num-attention-heads 8 on zaya1-tiny (hidden 128, 4 heads): Megatron-LM derives the
    head size (hidden / heads: 32, the preset's too), full attention, RoPE on all dimensions and the FFN from
    the hidden size; here the preset's values are kept, and the warning names each that differs. Given flags,
    and the preset's own sizes, say nothing."""
    base = tiny_run_flags(tiny_corpus, tmp_path)
    run = parse_args(base + ["--hidden-size", "256", "--num-attention-heads", "8", "--swiglu"])
    assert (run.model.kv_channels, run.model.num_query_groups, run.model.rotary_percent) == (32, 2, 0.5)
    assert run.warnings == ["--preset zaya1-tiny keeps its --num-query-groups 2, --rotary-percent 0.5, "
                            "--moe-ffn-hidden-size 256 (flags not given), where Megatron-LM would derive 8 (heads, "
                            "without --group-query-attention), 1.0 (its default), 640 (from hidden with --swiglu); "
                            "give the flags to choose"]
    run = parse_args(base + ["--hidden-size", "256", "--num-attention-heads", "4", "--group-query-attention",
                             "--rotary-percent", "0.5", "--ffn-hidden-size", "256"])
    assert run.warnings == ["--preset zaya1-tiny keeps its --kv-channels 32 (flags not given), where Megatron-LM "
                            "would derive 64 (hidden / heads); give the flags to choose"]
    given = ["--kv-channels", "64", "--num-query-groups", "4", "--rotary-percent", "1", "--ffn-hidden-size", "1024"]
    assert parse_args(base + ["--hidden-size", "256", "--num-attention-heads", "4", *given]).warnings == []
    assert parse_args(base + ["--hidden-size", "128", "--num-attention-heads", "4"]).warnings == []


def test_megatron_aliases_take_effect(tiny_corpus, tmp_path, capsys):
    """--ffn-hidden-size sizes the experts when --moe-ffn-hidden-size is absent (Megatron-LM's rule);
    --moe-router-bias-update-rate is the balancing biases' step; --no-mmap-bin-files reaches the data
    config; wandb flags are accepted with a warning that names where the scalars go."""
    base = tiny_run_flags(tiny_corpus, tmp_path)
    run = parse_args(base + ["--ffn-hidden-size", "48", "--moe-router-bias-update-rate", "1e-3", "--no-mmap-bin-files",
                             "--wandb-project", "zaya", "--tensorboard-dir", str(tmp_path / "tb")])
    assert run.model.moe_ffn_hidden_size == 48
    assert run.train.moe_router_bias_lr == 1e-3
    assert run.data.mmap_bin_files is False
    assert len(run.warnings) == 1 and "--wandb-project" in run.warnings[0] and str(tmp_path / "tb") in run.warnings[0]
    run = parse_args(base + ["--log-energy"])
    assert len(run.warnings) == 1 and run.warnings[0].startswith("--log-energy: the GPUs' energy is not read here")
    # A recent Megatron-LM LOGGING_ARGS block: the memory report's interval is accepted (memory is on every line)
    run = parse_args(base + ["--log-memory-interval", "10", "--log-device-memory-used", "--run-workload-inspector-server"])
    assert [w.split(":")[0] for w in run.warnings] == ["--log-device-memory-used", "--run-workload-inspector-server"]
    run = parse_args(base + ["--ffn-hidden-size", "48", "--moe-ffn-hidden-size", "40"])
    assert run.model.moe_ffn_hidden_size == 40 and run.train.moe_router_bias_lr == 1e-2 and run.data.mmap_bin_files
    assert run.warnings == []
    assert "--moe-router-bias-update-rate=0.001 and --moe-router-bias-lr=0.01" in error_of(
        base + ["--moe-router-bias-update-rate", "1e-3", "--moe-router-bias-lr", "1e-2"], capsys)
    # Megatron-LM's second names, and the --local-rank torch.distributed.launch appends
    run = parse_args(base + ["--persistent-save-interval", "5", "--save", str(tmp_path / "ckpt"),
                             "--override-opt-param-scheduler", "--local-rank=0"])
    assert run.train.save_interval == 5
    assert "--use-checkpoint-opt_param-scheduler needs --load" in error_of(
        base + ["--use-checkpoint-opt-param-scheduler"], capsys)
    assert parse_args(base + ["--local_rank=1"]).args.local_rank == 1


def test_megatron_spellings_of_what_this_code_does(tiny_corpus, tmp_path, capsys):
    """Megatron-LM's --optimizer adam (its AdamW) is adamw; --moe-layer-freq's list form with every block MoE is
    1, any 0 in it is refused; --distributed-backend nccl without a GPU stops with one line (it crashed in
    init_process_group after the data work); flags for what is absent here are refused by name."""
    base = tiny_run_flags(tiny_corpus, tmp_path)       # 2 layers
    assert parse_args(base + ["--optimizer", "adam"]).optim.optimizer == "adamw"
    for pattern in ("[1]*2", "([1]*2)", "[1, 1]"):
        assert parse_args(base + ["--moe-layer-freq", pattern]).args.moe_layer_freq == "1"
    for pattern, message in (("[1,0]", "--moe-layer-freq=[1,0] is not supported"),
                             ("[1]*3", "--moe-layer-freq=[1]*3 has 3 entries, and the model 2 layers")):
        assert message in error_of(base + ["--moe-layer-freq", pattern], capsys)
    # the preset's 4 layers (no --num-layers) count too: Megatron-LM refuses a pattern of another length
    preset_layers = tiny_run_flags(tiny_corpus, tmp_path, **{"--num-layers": None})
    assert "--moe-layer-freq=[1]*3 has 3 entries, and the model 4 layers: one entry per layer" in error_of(
        preset_layers + ["--moe-layer-freq", "[1]*3"], capsys)
    assert parse_args(preset_layers + ["--moe-layer-freq", "[1]*4"]).args.moe_layer_freq == "1"
    from tests.training.conftest import run_tool
    for tool, flags in (("model_stats", []), ("estimate", ["--gpus", "1", "--global-batch-size", "1"])):
        with pytest.raises(SystemExit):
            run_tool(tool, ["--preset", "zaya1-tiny", "--moe-layer-freq", "[1]*3"] + flags)
        assert "--moe-layer-freq=[1]*3 has 3 entries, and the model 4 layers" in capsys.readouterr().err
    import torch
    if not torch.cuda.is_available():
        assert "--distributed-backend nccl needs GPUs" in error_of(base + ["--distributed-backend", "nccl"], capsys)
        parse_args(base + ["--distributed-backend", "nccl", "--dry-run"])      # planned on a login node: fine
    for flags, message in ((["--distribute-saved-activations"], "--distribute-saved-activations is not supported"),
                           (["--moe-router-padding-for-fp8"], "--moe-router-padding-for-fp8 is not supported"),
                           (["--encoder-seq-length", "64"], "give the sequence length as --seq-length"),
                           (["--decoder-last-pipeline-num-layers", "2"], "there is no pipeline parallelism")):
        assert message in error_of(base + flags, capsys)


def test_moe_layer_freq_list_forms():
    """--moe-layer-freq's list form: every block MoE, through any number of parentheses, counted; an empty list
    or a 0 is no such pattern."""
    from megatron_zaya.megatron_flags import moe_layer_entries

    assert moe_layer_entries("(([1]*40))") == 40 and moe_layer_entries(" ( [1] * 3 ) ") == 3
    assert moe_layer_entries("[1,1]") == 2
    assert moe_layer_entries("[]") is moe_layer_entries("([])") is moe_layer_entries("[1, 0]") is None


def test_an_aliases_bad_value_names_the_flag_typed(tiny_corpus, tmp_path, capsys):
    """A value given by Megatron-LM's alias and refused under this code's name is named by the alias the user
    typed (it said --moe-ffn-hidden-size=0 for --ffn-hidden-size 0); the tools name it the same way."""
    base = tiny_run_flags(tiny_corpus, tmp_path)
    assert error_of(base + ["--ffn-hidden-size", "0"], capsys).endswith(
        "error: --ffn-hidden-size=0 (--moe-ffn-hidden-size): must be positive")
    assert error_of(base + ["--moe-router-bias-update-rate", "-1"], capsys).endswith(
        "error: --moe-router-bias-update-rate=-1.0 (--moe-router-bias-lr): must be >= 0")
    assert error_of(base + ["--moe-ffn-hidden-size", "0"], capsys).endswith(
        "error: --moe-ffn-hidden-size=0: must be positive")
    from tests.training.conftest import run_tool
    with pytest.raises(SystemExit):
        run_tool("model_stats", ["--preset", "zaya1-tiny", "--ffn-hidden-size", "0"])
    assert capsys.readouterr().err.strip().endswith(
        "error: --ffn-hidden-size=0 (--moe-ffn-hidden-size): must be positive")


@pytest.mark.parametrize("extra, message", [
    (["--cp-comm-type", "p2p", "ring"], "--cp-comm-type=p2p ring is not supported: only p2p or all_gather"),
    (["--hierarchical-context-parallel-sizes", "2", "2"],
     "--hierarchical-context-parallel-sizes=2 2 is not supported: drop the flag"),
    # the refusal of --cuda-graph-impl, not 'unrecognized arguments: moe_router' for the scope's list
    (["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn", "moe_router"],
     "--cuda-graph-impl=transformer_engine is not supported"),
])
def test_megatron_list_flags_take_lists_and_check_each_value(tiny_corpus, tmp_path, capsys, extra, message):
    """Megatron-LM parses these with nargs='+' (NVIDIA's DeepSeek-V3 scripts pass --cuda-graph-scope attn
    moe_router moe_preprocess): a list is read whole, and a refused value named with the flag."""
    assert message in error_of(tiny_run_flags(tiny_corpus, tmp_path) + extra, capsys)
