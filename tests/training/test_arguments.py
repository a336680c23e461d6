"""Flags are validated before anything expensive; each bad value gets one line naming the flag."""
import json
import os
import re

import pytest
import torch

from megatron_zaya.arguments import parse_args
from tests.training.helpers import tiny_run_flags


def error_of(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("extra, flag", [
    ({"--global-batch-size": "6", "--micro-batch-size": "4"}, "--global-batch-size"),
    ({"--preset": "zaya9"}, "--preset=zaya9"),
    ({"--data-path": "/nonexistent/prefix"}, "--data-path /nonexistent/prefix"),
    ({"--context-parallel-size": "1", "--seq-length": "30", "--num-attention-heads": "3"}, "--num-attention-heads=3"),
    ({"--lr-decay-style": "WSD", "--lr-wsd-decay-iters": "0"}, "--lr-wsd-decay-iters"),
    ({"--rampup-batch-size": ["2", "3", "100"]}, "--rampup-batch-size"),
    ({"--rampup-batch-size": ["2", "2", "100"]}, "--rampup-batch-size needs --train-samples instead of --train-iters"),
    ({"--expert-model-parallel-size": "3"}, "--expert-model-parallel-size=3"),
    ({"--muon-num-ns-steps": "0"}, "--muon-num-ns-steps"),
    ({"--lr-warmup-samples": "8"}, "--lr-warmup-samples does not go with --train-iters"),
    # Megatron-LM flags whose values ask for what this code does not do (megatron_flags.py)
    ({"--normalization": "LayerNorm"}, "--normalization=LayerNorm is not supported: only RMSNorm"),
    ({"--hidden-dropout": "0.1"}, "--hidden-dropout=0.1 is not supported"),
    ({"--moe-aux-loss-coeff": "1e-2"}, "--moe-aux-loss-coeff=1e-2 is not supported"),
    ({"--pipeline-model-parallel-size": "2"}, "--pipeline-model-parallel-size=2 is not supported"),
    ({"--fp16": ""}, "--fp16 is not supported: train with --bf16"),
    ({"--dataloader-type": "cyclic"}, "--dataloader-type=cyclic is not supported: only single"),
    ({"--use-torch-fsdp2": ""}, "--use-torch-fsdp2 is not supported: shard with --use-distributed-optimizer"),
    ({"--moe-expert-capacity-factor": "1.25"},
     "--moe-expert-capacity-factor=1.25 is not supported: drop the flag (experts are dropless)"),
    ({"--moe-router-score-function": "sigmoid"}, "--moe-router-score-function=sigmoid is not supported: only softmax"),
    ({"--expert-tensor-parallel-size": "2"}, "--expert-tensor-parallel-size=2 is not supported"),
    ({"--recompute-activations": "", "--recompute-granularity": "full"}, "--recompute-activations means"),
    ({"--moe-layer-recompute": "", "--recompute-granularity": "full"}, "--moe-layer-recompute means"),
    ({"--recompute-modules": "moe"}, "--recompute-modules needs --recompute-granularity selective"),
    ({"--recompute-granularity": "selective", "--recompute-modules": ["moe", "mlp"]},
     "--recompute-modules mlp: ZAYA1 blocks have no dense MLP"),
    ({"--squared-relu": ""}, "--squared-relu is not supported: the experts are SwiGLU"),
    ({"--add-qkv-bias": ""}, "--add-qkv-bias is not supported: CCA's projections have no bias"),
    ({"--window-size": "4096"}, "--window-size=4096 is not supported: drop the flag (CCA attends to the whole"),
    ({"--loss-scale": "1024"}, "--loss-scale=1024 is not supported: drop the flag (no loss scaling with bf16"),
    ({"--grad-reduce-in-bf16": ""}, "--grad-reduce-in-bf16 is not supported: gradients are reduced in fp32"),
    ({"--exit-signal": "SIGINT"}, "--exit-signal=SIGINT is not supported: only SIGTERM or SIGUSR1"),
    ({"--mid-level-dataset-surplus": "-0.1"}, "--mid-level-dataset-surplus=-0.1: must be >= 0"),
    ({"--lr-warmup-init": "1", "--lr": "0.01"}, "--lr-warmup-init=1.0 must be in [0, --lr=0.01]"),
    ({"--start-weight-decay": "0.1"}, "--start-weight-decay needs --weight-decay-incr-style linear or cosine"),
    ({"--muon-tp-mode": "distributed"}, "--muon-tp-mode"),
    ({"--fp8-format": "hybrid"}, "--fp8-format=hybrid is not supported: drop the flag (no FP8 here"),
    ({"--rerun-mode": "validate_results"}, "--rerun-mode=validate_results is not supported: only disabled"),
    ({"--dist-ckpt-strictness": "lenient"}, "--dist-ckpt-strictness=lenient is not supported: only"),
    ({"--disable-straggler-on-startup": ""}, "--disable-straggler-on-startup is not supported"),
    ({"--decoupled-min-lr": "1e-4"}, "--decoupled-min-lr needs --decoupled-lr"),
    # the decoupled schedule is checked with the flags too (it failed after the model was built, naming --lr)
    ({"--decoupled-lr": "1e-5", "--min-lr": "3e-5"}, "--min-lr=3e-05 is above --decoupled-lr=1e-05 (give "),
    ({"--decoupled-lr": "1e-5", "--decoupled-min-lr": "2e-5"}, "--decoupled-min-lr=2e-05 is above --decoupled-lr"),
    ({"--decoupled-lr": "1e-5", "--lr-warmup-init": "2e-5", "--lr-warmup-iters": "2"},
     "--lr-warmup-init=2e-05 is above --decoupled-lr=1e-05"),
    ({"--batch-size": "8"}, "--batch-size=8 is not supported: drop the flag (Megatron-LM's old name: use "
                            "--micro-batch-size)"),
    ({"--checkpoint-activations": ""}, "--checkpoint-activations is not supported: it is Megatron-LM's old name"),
    ({"--model-parallel-size": "2"}, "use --tensor-model-parallel-size"),
    ({"--head-lr-mult": "2"}, "--head-lr-mult=2 is not supported: only 1"),
    ({"--mtp-num-layers": "1"}, "--mtp-num-layers=1 is not supported: only 0"),
    ({"--apply-residual-connection-post-layernorm": ""}, "ZAYA1's blocks are pre-norm"),
    ({"--ddp-num-buckets": "4", "--ddp-bucket-size": "1000"},
     "--ddp-num-buckets=4 and --ddp-bucket-size=1000 set the same thing"),
    ({"--ddp-num-buckets": "0"}, "--ddp-num-buckets=0: must be >= 1"),
    ({"--max-consecutive-nonfinite": "0"}, "--max-consecutive-nonfinite=0: must be >= 1"),
    ({"--watchdog-first-iteration-seconds": "0"}, "--watchdog-first-iteration-seconds=0.0: must be > 0"),
    # 0 would be silently ignored (the loop tests the flag for truth), not the immediate exit it reads as
    ({"--exit-duration-in-mins": "0"}, "--exit-duration-in-mins=0.0: must be > 0"),
    ({"--use-mp-args-from-checkpoint-args": ""}, "--use-mp-args-from-checkpoint-args needs --use-checkpoint-args"),
    ({"--finetune": ""}, "--finetune starts from a checkpoint's weights: give --load (or --pretrained-checkpoint)"),
    ({"--embedding-init-method-std": "-1"}, "--embedding-init-method-std=-1.0: must be >= 0"),
    ({"--enable-cuda-graph": ""}, "--enable-cuda-graph is not supported: no CUDA graphs"),
    ({"--cuda-graph-impl": "local"}, "--cuda-graph-impl=local is not supported: only none"),
    ({"--cpu-offloading-num-layers": "2"}, "--cpu-offloading-num-layers=2 is not supported: only 0"),
    ({"--distributed-timeout-seconds-after-init": "600"},
     "--distributed-timeout-seconds-after-init=600 is not supported: drop the flag (one timeout for the whole run"),
    ({"--moe-extended-tp": ""}, "--moe-extended-tp is not supported"),
    ({"--delay-wgrad-compute": ""}, "--delay-wgrad-compute is not supported"),
    ({"--fp8-param-gather": ""}, "--fp8-param-gather is not supported: no FP8 here"),
])
def test_bad_flags_fail_fast_naming_the_flag(tiny_corpus, tmp_path, capsys, extra, flag):
    extra = dict(extra)
    multi = {k: v for k, v in extra.items() if isinstance(v, list)}
    argv = tiny_run_flags(tiny_corpus, tmp_path, **{k: v for k, v in extra.items() if k not in multi})
    for k, values in multi.items():
        argv += [k, *values]
    line = error_of(argv, capsys)
    assert line.startswith("pretrain_zaya.py: error:") and flag in line, line


def test_cp_needs_sequence_divisible_by_twice_cp(tiny_corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    argv = tiny_run_flags(tiny_corpus, tmp_path, **{"--context-parallel-size": "4", "--seq-length": "36",
                                                     "--global-batch-size": "4"})
    assert "--seq-length=36" in error_of(argv, capsys)
    # chunks shorter than the steps CCA's convolutions read back (2 here) failed in the first forward
    argv = tiny_run_flags(tiny_corpus, tmp_path, **{"--context-parallel-size": "2", "--seq-length": "4",
                                                     "--global-batch-size": "4"})
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert "must hold at least the 2 steps CCA's convolutions read back" in error_of(argv, capsys)
    # chunks of exactly those 2 steps are enough
    argv = tiny_run_flags(tiny_corpus, tmp_path, **{"--context-parallel-size": "2", "--seq-length": "8",
                                                     "--global-batch-size": "4"})
    run = parse_args(argv)
    assert run.model.seq_length // (2 * 2) == run.model.cca_lookback == 2


def _flags_with(tiny_corpus, tmp_path, extra):
    """tiny_run_flags plus `extra`; a list value is several words, None drops a default flag."""
    multi = {k: v for k, v in extra.items() if isinstance(v, list)}
    argv = tiny_run_flags(tiny_corpus, tmp_path, **{k: v for k, v in extra.items() if k not in multi})
    for k, values in multi.items():
        argv += [k, *values]
    return argv


# Each of these used to pass validation and die later (after the model was built) with a traceback.
LATE_ERRORS = [
    ({"--split": "abc"}, "--split 'abc'"),
    ({"--split": "1,1,1,1"}, "--split '1,1,1,1'"),
    ({"--split": "0,0,0"}, "--split '0,0,0'"),
    ({"--split=-5,10,1": ""}, "--split '-5,10,1'"),          # one word: argparse takes -5 for a flag
    ({"--split": "0,100,0"}, "--split 0,100,0: the train share is 0"),
    ({"--data-path": ["30", "{P}", "70"]}, "expected weight/path pairs"),
    ({"--data-path": ["0", "{P}", "0", "{P}"]}, "positive sum"),
    ({"--data-path": ["-1", "{P}", "2", "{P}"]}, "weight -1"),
    ({"--tokenizer-type": "Bogus"}, "--tokenizer-type 'Bogus'"),
    ({"--tokenizer-model": None}, "needs --tokenizer-model"),
    ({"--tokenizer-type": "NullTokenizer", "--tokenizer-model": "many"}, "--tokenizer-model 'many'"),
    ({"--seed": "-1"}, "--seed=-1"),
    ({"--seed": str(2**33)}, f"--seed={2**33}"),
    ({"--eval-iters": "-1"}, "--eval-iters=-1"),
    ({"--ckpt-keep": "0"}, "--ckpt-keep=0"),
    ({"--ckpt-keep": "-1"}, "--ckpt-keep=-1"),
    ({"--optimizer": "adamw", "--adam-beta1": "1.5"}, "--adam-beta1=1.5"),
    ({"--adam-beta2": "nan"}, "--adam-beta2=nan"),
    ({"--adam-beta2": "1"}, "--adam-beta2=1.0: must be in [0, 1)"),       # the boundaries themselves
    ({"--seed": str(2**32)}, f"--seed={2**32}: must be in [0, 2**32 - 1]"),
    ({"--adam-eps": "0"}, "--adam-eps=0.0"),
    ({"--clip-grad": "-1"}, "--clip-grad=-1.0"),
    ({"--lr": "-0.1", "--min-lr": "-1"}, "--lr=-0.1"),
    ({"--train-iters": "0"}, "--train-iters=0"),
    ({"--train-iters": "-3"}, "--train-iters=-3"),
    ({"--train-iters": None, "--train-samples": "0"}, "--train-samples=0"),
    ({"--make-vocab-size-divisible-by": "0"}, "--make-vocab-size-divisible-by=0"),
]


@pytest.mark.parametrize("extra, expected", LATE_ERRORS)
def test_late_errors_are_caught_by_validation(tiny_corpus, tmp_path, capsys, extra, expected):
    prefix = tiny_corpus[0]
    extra = {k: [w.replace("{P}", prefix) for w in v] if isinstance(v, list) else v for k, v in extra.items()}
    line = error_of(_flags_with(tiny_corpus, tmp_path, extra), capsys)
    assert line.startswith("pretrain_zaya.py: error:") and expected in line, line


def _damaged_copy(tiny_corpus, tmp_path, ext, keep_bytes):
    prefix = str(tmp_path / "damaged_text_document")
    for e in (".bin", ".idx"):
        data = open(tiny_corpus[0] + e, "rb").read()
        open(prefix + e, "wb").write(data[:keep_bytes] if e == ext else data)
    return prefix


@pytest.mark.parametrize("ext, keep", [(".idx", 1000), (".idx", 10), (".bin", 1000)])
def test_truncated_dataset_is_named_before_any_work(tiny_corpus, tmp_path, capsys, ext, keep):
    prefix = _damaged_copy(tiny_corpus, tmp_path, ext, keep)
    line = error_of(tiny_run_flags(tiny_corpus, tmp_path, **{"--data-path": prefix}), capsys)
    assert f"--data-path {prefix}: {prefix}{ext}" in line, line


@pytest.mark.parametrize("world, extra, expected", [
    ("2", {"--tensor-model-parallel-size": "2", "--sequence-parallel": "", "--seq-length": "33"},
     "must be divisible by --tensor-model-parallel-size=2"),
    ("8", {"--tensor-model-parallel-size": "4", "--context-parallel-size": "2", "--sequence-parallel": "",
           "--seq-length": "36", "--global-batch-size": "2", "--micro-batch-size": "1"},
     "(36 / --context-parallel-size=2 = 18) must be divisible by --tensor-model-parallel-size=4"),
    ("1", {"--ddp-bucket-size": "0"}, "--ddp-bucket-size=0"),
])
def test_layout_rules_that_used_to_fail_after_the_process_groups(tiny_corpus, tmp_path, capsys, monkeypatch,
                                                                  world, extra, expected):
    """Sequence/tensor/context-parallel rules that only failed at ParallelState or the first forward."""
    monkeypatch.setenv("WORLD_SIZE", world)
    line = error_of(tiny_run_flags(tiny_corpus, tmp_path, **extra), capsys)
    assert line.startswith("pretrain_zaya.py: error:") and expected in line, line


def test_sequence_parallel_without_tensor_parallelism_is_switched_off_with_a_warning(tiny_corpus, tmp_path,
                                                                                    monkeypatch):
    """As Megatron-LM does: MoE launch scripts pass --sequence-parallel whatever TP is."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--sequence-parallel": ""}))
    assert not run.parallel.sequence_parallel
    assert any(w.startswith("--sequence-parallel is off") for w in run.warnings)


def test_ddp_bucket_size_reaches_the_layout(tiny_corpus, tmp_path):
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--ddp-bucket-size": "1000"}))
    assert (run.parallel.ddp_bucket_size, run.parallel.ddp_num_buckets) == (1000, None)
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--ddp-num-buckets": "2"}))
    assert (run.parallel.ddp_bucket_size, run.parallel.ddp_num_buckets) == (40_000_000, 2)


def test_fault_tolerance_flags_reach_the_train_config(tiny_corpus, tmp_path):
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path))
    assert (run.train.max_consecutive_nonfinite, run.train.watchdog_first_iteration_seconds) == (3, 1800.0)
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{
        "--max-consecutive-nonfinite": "5", "--watchdog-timeout-factor": "4", "--watchdog-min-seconds": "120",
        "--watchdog-first-iteration-seconds": "7200"}))
    assert (run.train.max_consecutive_nonfinite, run.train.watchdog_timeout_factor, run.train.watchdog_min_seconds,
            run.train.watchdog_first_iteration_seconds) == (5, 4.0, 120.0, 7200.0)


def test_ddp_num_buckets_sizes_the_buckets():
    """--ddp-num-buckets N: buckets of 1/N of the rank's gradient elements (a parameter never splits, so
    one larger than that makes a bucket of its own)."""
    from types import SimpleNamespace

    from megatron_zaya.config import model_config_from_preset
    from megatron_zaya.model import ZayaModel
    from megatron_zaya.parallel.data import GradientReducer, bucket_size_for

    model = ZayaModel(model_config_from_preset("zaya1-tiny", num_layers=2))
    groups = SimpleNamespace(dp_cp_group=None, world_group=None, expert_dp_group=None)    # nothing is launched
    total = sum(p.numel() for p in model.parameters())
    for n in (1, 2, 4, 8):
        size = bucket_size_for(model.parameters(), n)
        assert size == -(-total // n)
        buckets = GradientReducer(model, groups, bucket_size=size).buckets
        assert sum(sum(p.numel() for p in b.params) for b in buckets) == total
        assert all(sum(p.numel() for p in b.params) <= size or len(b.params) == 1 for b in buckets)
        assert len(buckets) == n if n <= 2 else n // 2 <= len(buckets) <= n


def test_decrease_batch_size_if_needed(tiny_corpus, tmp_path, capsys, monkeypatch):
    """Megatron-LM's --decrease-batch-size-if-needed: 3 data-parallel ranks of micro batch 2 cannot split a
    global batch of 16: the run takes 12 (the largest multiple of 6), says so, and stops without the flag."""
    monkeypatch.setenv("WORLD_SIZE", "3")
    flags = tiny_run_flags(tiny_corpus, tmp_path, **{"--global-batch-size": "16"})
    assert "batch size 16 is not divisible by --micro-batch-size x data-parallel size = 6" in error_of(flags, capsys)
    run = parse_args(flags + ["--decrease-batch-size-if-needed"])
    assert run.train.global_batch_size == 12
    assert any("global batch 12 instead of --global-batch-size=16" in w for w in run.warnings)
    fits = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--global-batch-size": "18"})
                      + ["--decrease-batch-size-if-needed"])
    assert fits.train.global_batch_size == 18 and not any("global batch" in w for w in fits.warnings)
    small = tiny_run_flags(tiny_corpus, tmp_path, **{"--global-batch-size": "4"}) + ["--decrease-batch-size-if-needed"]
    assert "is less than one micro-batch per data-parallel rank" in error_of(small, capsys)
    ramp = tiny_run_flags(tiny_corpus, tmp_path, **{"--global-batch-size": "16", "--train-iters": None,
                                                    "--train-samples": "64"}) + [
        "--decrease-batch-size-if-needed", "--rampup-batch-size", "6", "6", "100"]
    assert "does not combine with --rampup-batch-size" in error_of(ramp, capsys)


def test_without_global_batch_size_each_data_parallel_rank_takes_one_micro_batch(tiny_corpus, tmp_path, monkeypatch):
    """Megatron-LM's default: --global-batch-size = --micro-batch-size x data-parallel size."""
    monkeypatch.setenv("WORLD_SIZE", "8")
    for extra, expected in (({}, 16), ({"--tensor-model-parallel-size": "2"}, 8)):
        run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--global-batch-size": None}, **extra))
        assert run.train.global_batch_size == expected


def test_folders_to_create_are_checked(tiny_corpus, tmp_path, capsys):
    nested = tmp_path / "runs" / "x" / "y" / "z"
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--save": nested, "--tensorboard-dir": nested / "tb"}))
    assert run.train.save == str(nested) and not (tmp_path / "runs").exists()     # nothing created yet
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for flag in ("--save", "--tensorboard-dir", "--data-cache-path"):
        assert f"{flag} {a_file}: exists and is not a directory" in error_of(
            tiny_run_flags(tiny_corpus, tmp_path, **{flag: a_file}), capsys)
        assert f"{a_file} is not a directory" in error_of(
            tiny_run_flags(tiny_corpus, tmp_path, **{flag: a_file / "sub"}), capsys)
    assert "--load" in error_of(tiny_run_flags(tiny_corpus, tmp_path, **{"--load": a_file}), capsys)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_uncreatable_folder_is_caught_even_as_root(tiny_corpus, tmp_path, capsys):
    """os.access() says yes to root even in /proc; the check makes a real (temporary) folder."""
    line = error_of(tiny_run_flags(tiny_corpus, tmp_path, **{"--tensorboard-dir": "/proc/nope/tb"}), capsys)
    assert "--tensorboard-dir /proc/nope/tb: cannot create folders in /proc" in line


def _megatron_lm_checkpoint(root, files):
    root.mkdir()
    (root / "latest_checkpointed_iteration.txt").write_text("100\n")
    for name in files:
        (root / "iter_0000100" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "iter_0000100" / name).write_bytes(b"\x80")
    return root


@pytest.mark.parametrize("files", [["mp_rank_00/model_optim_rng.pt"], ["__0_0.distcp", "common.pt", "metadata.json"]])
def test_megatron_lm_checkpoint_is_named_before_the_model_is_built(tiny_corpus, tmp_path, capsys, files):
    ckpt = _megatron_lm_checkpoint(tmp_path / "mlm", files)
    line = error_of(tiny_run_flags(tiny_corpus, tmp_path, **{"--load": ckpt}), capsys)
    assert f"--load {ckpt}" in line and "not a megatron-zaya checkpoint (looks like Megatron-LM" in line, line


@pytest.mark.parametrize("weights", ["model.safetensors", "model.safetensors.index.json"])
@pytest.mark.parametrize("flag", ["--load", "--pretrained-checkpoint"])
def test_a_hugging_face_folder_as_load_names_the_conversion(tiny_corpus, tmp_path, capsys, weights, flag):
    """An HF folder is not "no checkpoint" (which would train from scratch after a warning): the error
    gives the from-hf command, before anything is built."""
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / weights).write_text("")
    line = error_of(tiny_run_flags(tiny_corpus, tmp_path, **{flag: hf}), capsys)
    assert f"{flag} {hf}: a Hugging Face model folder, not a training checkpoint" in line, line
    assert f"tools/convert_checkpoint.py from-hf {hf} DIR, then {flag} DIR" in line, line


def test_own_checkpoint_folder_and_missing_load_pass(tiny_corpus, tmp_path):
    ours = tmp_path / "ours" / "iter_0000100"
    ours.mkdir(parents=True)
    for name in ("COMPLETE", "metadata.json", "rank_00000.safetensors"):
        (ours / name).write_text("")
    (ours.parent / "latest_checkpointed_iteration.txt").write_text("100\n")
    assert parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--load": ours.parent})).train.load
    assert parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--load": tmp_path / "none"})).train.load


def test_main_turns_late_user_errors_into_one_line(tiny_corpus, tmp_path, capsys, monkeypatch):
    """Errors in the user's input found during setup (a dataset damaged after validation, a bad
    checkpoint, an unusable path) exit with status 2 and one line; bugs keep their traceback."""
    import pretrain_zaya
    from megatron_zaya.checkpoint.format import CheckpointError
    from megatron_zaya.data.indexed import IndexedDatasetError
    from megatron_zaya.errors import UserInputError

    argv = tiny_run_flags(tiny_corpus, tmp_path)
    worker = UserInputError("Caught UserInputError in DataLoader worker process 0.\nOriginal Traceback (most recent "
                            "call last):\n  File \"w.py\", line 1, in f\nmegatron_zaya.errors.UserInputError: d: "
                            "sample 3 holds token id 750\n")        # as torch re-raises a worker's error
    for err, line in [(IndexedDatasetError("x.idx: truncated"), "x.idx: truncated"),
                      (worker, "d: sample 3 holds token id 750"),
                      (CheckpointError("--load c: no loadable checkpoint"), "--load c: no loadable checkpoint"),
                      (FileExistsError(17, "File exists", "/runs/s"), "/runs/s: File exists")]:
        monkeypatch.setattr(pretrain_zaya, "build_and_train", lambda run, err=err: (_ for _ in ()).throw(err))
        assert pretrain_zaya.main(argv) == 2
        assert capsys.readouterr().err.strip().splitlines() == [f"pretrain_zaya.py: error: {line}"]
    monkeypatch.setenv("RANK", "1")            # a rank of a torchrun job says which rank met the error
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert pretrain_zaya.main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"pretrain_zaya.py: error (rank 1 of 2): {line}"]
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    for bug in (RuntimeError("a bug"), ValueError("a bug"), OSError("no file name")):
        monkeypatch.setattr(pretrain_zaya, "build_and_train", lambda run, bug=bug: (_ for _ in ()).throw(bug))
        with pytest.raises(type(bug)):
            pretrain_zaya.main(argv)


def test_default_index_cache_beside_the_data_is_checked(tiny_corpus, tmp_path, capsys):
    """Without --data-cache-path the index cache goes to <data dir>/cache/GPTDataset_indices."""
    prefix = _damaged_copy(tiny_corpus, tmp_path, ".bin", None)        # an intact copy
    (tmp_path / "cache").write_text("")                                  # a file where the folder goes
    line = error_of(tiny_run_flags(tiny_corpus, tmp_path, **{"--data-path": prefix, "--data-cache-path": None}),
                    capsys)
    assert "index cache (no --data-cache-path" in line and f"{tmp_path / 'cache'} is not a directory" in line


def test_recompute_flags_follow_megatron(tiny_corpus, tmp_path, capsys):
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--recompute-granularity": "full"}))
    assert (run.train.recompute_method, run.train.recompute_num_layers) == ("uniform", 1)
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--recompute-granularity": "full",
                                                               "--recompute-method": "block"}))
    assert run.train.recompute_num_layers == 2           # block: all layers unless told
    assert "--recompute-method needs --recompute-granularity full" in error_of(
        tiny_run_flags(tiny_corpus, tmp_path, **{"--recompute-method": "uniform"}), capsys)
    assert "--recompute-num-layers=3 exceeds --num-layers=2" in error_of(
        tiny_run_flags(tiny_corpus, tmp_path, **{"--recompute-granularity": "full", "--recompute-num-layers": "3"}),
        capsys)
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--recompute-granularity": "selective"}))
    assert (run.train.recompute_method, run.train.recompute_num_layers) == (None, None)
    for flag, value in (("--recompute-method", "block"), ("--recompute-num-layers", "1")):
        assert f"{flag} needs --recompute-granularity full, not --recompute-granularity selective" in error_of(
            tiny_run_flags(tiny_corpus, tmp_path, **{"--recompute-granularity": "selective", flag: value}), capsys)


CHEAP_MODULES = {"layernorm", "core_attn", "moe_act"}


@pytest.mark.parametrize("flags, granularity, units, modules", [
    ({}, None, [], set()),
    ({"--recompute-granularity": "full", "--recompute-method": "block", "--recompute-num-layers": "1"}, "full", [(0, 1)],
     set()),
    ({"--recompute-granularity": "selective"}, "selective", [], CHEAP_MODULES),
    ({"--recompute-granularity": "selective", "--recompute-modules": ["moe", "core_attn"]}, "selective", [],
     {"moe", "core_attn"}),
    ({"--moe-layer-recompute": ""}, "selective", [], CHEAP_MODULES | {"moe"}),
])
def test_recompute_flags_reach_the_model(tiny_corpus, tmp_path, flags, granularity, units, modules):
    """pretrain_zaya.py's flags -> RunConfig -> the model training builds (setup.build_model): its memory
    policy, with the math's config untouched."""
    from megatron_zaya.training.setup import build_model

    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **flags))
    model = build_model(run)
    assert model.recompute_granularity == granularity
    assert [(u.start, u.stop) for u in model.recompute_units] == units
    selective = [(m.recompute_module, m.recompute_selective) for m in model.modules() if hasattr(m, "recompute_module")]
    # (moe_act's pieces are inside an MoE sublayer: off when "moe" reruns the whole sublayer)
    expected = {name: name in modules and not (name == "moe_act" and "moe" in modules) for name, _ in selective}
    assert selective and all(on == expected[name] for name, on in selective)
    assert set(model.recompute_modules) == (modules if granularity == "selective" else set())
    assert model.config == run.model


def test_muon_flags_reach_the_optimizer(tiny_corpus, tmp_path):
    """--muon-num-ns-steps and --muon-tp-mode (Megatron-LM's names) -> OptimizerConfig -> Muon; one
    process has no TP group, whatever the mode."""
    from megatron_zaya.optim.builder import build_optimizer
    from megatron_zaya.training.setup import build_model

    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path))
    assert (run.optim.muon_ns_steps, run.optim.muon_tp_mode) == (5, "duplicated")
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--muon-num-ns-steps": "3",
                                                                "--muon-tp-mode": "blockwise"}))
    assert (run.optim.muon_ns_steps, run.optim.muon_tp_mode) == (3, "blockwise")
    muon = build_optimizer(build_model(run), run.optim).optimizers["muon"]
    assert muon.param_groups[0]["ns_steps"] == 3 and muon.tp_group is None


def test_per_split_data_paths_train_and_validate(tiny_corpus, tmp_path, capsys):
    """--train-data-path / --valid-data-path instead of --data-path + --split: checked like --data-path
    (a missing prefix is named with its flag), exclusive with --data-path, and a run trains on the one
    and validates on the other."""
    from megatron_zaya.training.setup import build_and_train
    prefix, _ = tiny_corpus
    assert "--data-path and --valid-data-path exclude each other" in error_of(
        tiny_run_flags(tiny_corpus, tmp_path, **{"--valid-data-path": prefix}), capsys)
    assert "--valid-data-path /nonexistent/valid" in error_of(
        tiny_run_flags(tiny_corpus, tmp_path, **{"--data-path": None, "--train-data-path": prefix,
                                                 "--valid-data-path": "/nonexistent/valid"}), capsys)
    assert "--test-data-path needs --train-data-path" in error_of(
        tiny_run_flags(tiny_corpus, tmp_path, **{"--data-path": None, "--test-data-path": prefix}), capsys)
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--data-path": None, "--train-data-path": prefix,
                                                               "--valid-data-path": prefix, "--train-iters": 3}))
    assert run.data.train_data_path == [prefix] and run.data.valid_data_path == [prefix] and not run.data.data_path
    assert build_and_train(run) == 0
    assert "validation at iteration 3" in capsys.readouterr().out


def test_mock_data_trains_without_files(tmp_path, capsys):
    """Megatron-LM's smoke run: --mock-data with --tokenizer-type NullTokenizer --vocab-size N and no
    corpus at all; --mock-data with a --data-path is refused."""
    from megatron_zaya.training.setup import build_and_train
    argv = ["--preset", "zaya1-tiny", "--num-layers", "1", "--mock-data", "--tokenizer-type", "NullTokenizer",
            "--vocab-size", "512", "--micro-batch-size", "2", "--global-batch-size", "4", "--seq-length", "32",
            "--train-iters", "3", "--eval-interval", "3", "--eval-iters", "1", "--num-workers", "0",
            "--log-interval", "1"]
    assert build_and_train(parse_args(argv + ["--log-num-zeros-in-grad", "--untie-embeddings-and-output-weights",
                                              "--wandb-project", "zaya", "--log-params-norm"])) == 0
    out, err = capsys.readouterr()
    assert "WARNING --wandb-project: Weights & Biases logging is not implemented" in err
    assert "iteration        3/       3" in out and "validation at iteration 3" in out
    # 4 x 32 tokens a step leave at least 384 of the 512 rows of the (untied) input embedding unseen:
    # their gradients are exact zeros (zaya1-tiny: hidden size 128)
    zeros = [int(float(n)) for n in re.findall(r"\| num zeros: (\d+\.0) \|", out)]     # (Megatron-LM's {:.1f})
    assert len(zeros) == 3 and all(n >= 384 * 128 for n in zeros), zeros
    assert len(re.findall(r"\| params norm: \d+\.\d{3} \|", out)) == 3     # --log-params-norm: on the console line
    # the start-up line gives the active count with and without the embedding (ZAYA1 publishes the latter)
    from megatron_zaya.model.accounting import count_parameters
    config = parse_args(argv).model
    without = count_parameters(config).active_non_embedding(config.num_experts)
    assert f"({without / 1e6:.2f}M without the embedding)" in out
    assert "--mock-data and --data-path exclude each other" in error_of(argv + ["--data-path", "x"], capsys)


def test_save_retain_interval_is_checked_against_save_interval(tiny_corpus, tmp_path, capsys):
    base = tiny_run_flags(tiny_corpus, tmp_path) + ["--save", str(tmp_path / "ckpt")]
    assert "--save-retain-interval 3 is not a multiple of --save-interval 2" in error_of(
        base + ["--save-interval", "2", "--save-retain-interval", "3"], capsys)
    assert "--save-retain-interval needs --save and --save-interval" in error_of(
        base + ["--save-retain-interval", "4"], capsys)
    assert parse_args(base + ["--save-interval", "2", "--save-retain-interval", "4"]).train.save_retain_interval == 4


def test_deterministic_mode_holds_for_the_run_only(tiny_corpus, tmp_path, monkeypatch):
    """--deterministic-mode: torch's deterministic algorithms during every step (same losses on this
    CPU), and the process's earlier setting afterwards."""
    import torch

    from megatron_zaya.training import loop
    from megatron_zaya.training.setup import build_and_train
    seen, real_step = [], loop.Trainer.train_step

    def train_step(trainer, micro_batches):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return real_step(trainer, micro_batches)
    monkeypatch.setattr(loop.Trainer, "train_step", train_step)
    flags = tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": 2, "--eval-iters": 0})
    assert build_and_train(parse_args(flags + ["--deterministic-mode"])) == 0
    assert seen == [True, True] and not torch.are_deterministic_algorithms_enabled()


def test_data_args_files_stand_for_the_blend_flags(tiny_corpus, tmp_path, capsys):
    """Megatron-LM's --data-args-path (the --data-path blend in a file) and --per-split-data-args-path
    (JSON of train / valid / test blends), for blends too long for a command line."""
    prefix = tiny_corpus[0]
    blend = tmp_path / "blend.txt"
    blend.write_text(f"0.3 {prefix}\n0.7 {prefix}\n")
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--data-path": None, "--data-args-path": blend}))
    assert run.data.data_path == ["0.3", prefix, "0.7", prefix]
    splits = tmp_path / "splits.json"
    splits.write_text(json.dumps({"train": ["1", prefix], "valid": prefix}))
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--data-path": None, "--per-split-data-args-path": splits}))
    assert (run.data.train_data_path, run.data.valid_data_path, run.data.test_data_path) == (["1", prefix], [prefix], [])
    (tmp_path / "empty.txt").write_text("\n")
    (tmp_path / "bad.json").write_text(json.dumps({"training": [prefix]}))
    for extra, expected in (
            ({"--data-args-path": blend}, "--data-args-path and --data-path exclude each other"),
            ({"--data-path": None, "--data-args-path": tmp_path / "empty.txt"}, "empty.txt: the file is empty"),
            ({"--data-path": None, "--data-args-path": tmp_path / "nope.txt"}, "nope.txt: cannot read"),
            ({"--per-split-data-args-path": splits}, "--per-split-data-args-path and --data-path exclude each other"),
            ({"--data-path": None, "--per-split-data-args-path": tmp_path / "bad.json"},
             "expected a JSON object with keys among train, valid, test (got ['training'])"),
            ({"--data-path": None, "--data-args-path": tmp_path / "blend.txt", "--logging-level": "-1"},
             "--logging-level=-1: must be >= 0")):
        line = error_of(tiny_run_flags(tiny_corpus, tmp_path, **extra), capsys)
        assert expected in line, line


def test_disable_bf16_reduced_precision_matmul_sets_torchs_switch(tiny_corpus, tmp_path, monkeypatch):
    import torch

    from megatron_zaya.training.setup import build_and_train
    matmul = torch.backends.cuda.matmul
    monkeypatch.setattr(matmul, "allow_bf16_reduced_precision_reduction", True)   # restored after the test
    flags = tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": 1, "--eval-iters": 0})
    assert build_and_train(parse_args(flags + ["--disable-bf16-reduced-precision-matmul"])) == 0
    assert matmul.allow_bf16_reduced_precision_reduction is False


def test_embedding_init_method_std_reaches_model_and_optimizer(tiny_corpus, tmp_path):
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--embedding-init-method-std": "0.5"}))
    assert run.model.embedding_init_method_std == 0.5 and run.optim.embedding_weight_decay is False
    plain = parse_args(tiny_run_flags(tiny_corpus, tmp_path))
    assert plain.model.embedding_init_method_std is None and plain.optim.embedding_weight_decay is True


@pytest.mark.parametrize("rank, local_rank, printed", [("0", "0", True), ("1", "1", False), ("2", "0", True)])
def test_bad_flag_is_reported_once_per_node(tiny_corpus, tmp_path, capsys, monkeypatch, rank, local_rank, printed):
    """Every rank of a launch parses the same flags: only each node's first process (local rank 0;
    files can differ between nodes) prints the error; every rank exits with status 2."""
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    monkeypatch.setenv("WORLD_SIZE", "4")
    argv = tiny_run_flags(tiny_corpus, tmp_path, **{"--micro-batch-size": "0"})
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert ("--micro-batch-size=0: must be >= 1" in err) == printed and (err == "") != printed


def test_a_model_to_be_loaded_is_built_on_meta_and_allocated_by_the_runtime(tiny_corpus, tmp_path):
    """setup.build_model(initialize=False) allocates nothing; runtime.place_on allocates it on the
    runtime's device keeping the tensors' parallel markers (to_empty makes new Parameters), and moves a
    built model as it is."""
    from megatron_zaya.training.runtime import place_on
    from megatron_zaya.training.setup import build_model

    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path))
    model = build_model(run, initialize=False)
    assert all(t.is_meta for t in model.state_dict().values())
    model.embedding.weight.partitions = [("tp", 0, [[(0, 4)]])]
    model.layers[0].moe.experts.gate_up_weight.is_expert = True
    placed = place_on(model, torch.device("cpu"))
    assert not any(t.is_meta for t in placed.state_dict().values())
    assert placed.embedding.weight.partitions == [("tp", 0, [[(0, 4)]])]
    assert placed.layers[0].moe.experts.gate_up_weight.is_expert
    built = build_model(run)
    weight = built.embedding.weight
    assert place_on(built, torch.device("cpu")).embedding.weight is weight


def test_data_parallel_size_leaves_out_tensor_and_context_parallel_ranks(tiny_corpus, tmp_path, monkeypatch):
    """8 ranks as TP 2 x CP 2 x DP 2: Megatron-LM's default global batch is one micro-batch per data-parallel rank."""
    monkeypatch.setenv("WORLD_SIZE", "8")
    run = parse_args(_flags_with(tiny_corpus, tmp_path, {"--tensor-model-parallel-size": "2",
                                                         "--context-parallel-size": "2", "--global-batch-size": None,
                                                         "--micro-batch-size": "3"}))
    assert run.parallel.data_parallel_size == 2 and run.train.global_batch_size == 6
