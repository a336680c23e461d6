"""The throughput bench scripts run end to end for a step or two on a tiny config (no timing checks)."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron_zaya.kernels.capability import newton_schulz_dtype

REPO = Path(__file__).resolve().parents[2]
TINY = ["--preset", "zaya1-tiny", "--num-layers", "2", "--seq-length", "32", "--micro-batch-size", "2"]


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_train_throughput_one_process_reports_everything(tmp_path, capsys, keep_threads):
    bench = load_script("train_throughput")
    args = TINY + ["--global-batch-size", "4", "--warmup", "1", "--iters", "1", "--bf16", "--json", str(tmp_path / "r.json")]
    if importlib.util.find_spec("transformers") is not None:
        args.append("--compare-reference")
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    for text in ("tokens/s", "TFLOP/s", "MFU", "of bf16 peak", "of fp32 peak", "time split", "peak memory"):
        assert text in out, text
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["tokens_per_step"] == 4 * 32
    assert set(report["split_s"]) == {"data", "forward", "backward", "communication", "optimizer", "balancing", "other"}
    assert report["split_s"]["forward"] > 0 and report["split_s"]["backward"] > 0 and report["split_s"]["optimizer"] > 0
    assert report["peak_tflops"]["bf16"] > 0 and report["peak_tflops"]["fp32"] > 0
    assert report["peak_memory_bytes"] > 0 and all(map(lambda x: x == x, report["losses"]))
    if "reference" in report:
        # Same weights, same batches, same optimizer: the first step's losses agree.
        assert abs(report["reference"]["losses"][0] - report["losses"][0]) < 1e-2


def test_train_throughput_weight_casts_ab(capsys, keep_threads):
    """--weight-casts-ab alternates steps with the model's per-step weight copies and without (a detached
    WeightCasts), and reports both."""
    bench = load_script("train_throughput")
    assert bench.main(TINY + ["--global-batch-size", "4", "--warmup", "0", "--iters", "1", "--bf16",
                              "--weight-casts-ab"]) == 0
    out = capsys.readouterr().out
    assert "per-step weight copies, steps alternating: on" in out and "per-pair speed-up" in out


def test_train_throughput_with_forced_balanced_routing_and_moe_recompute(capsys, keep_threads):
    """--moe-router-force-load-balancing and --recompute-granularity / --recompute-modules reach the
    benchmark's model: every router of the run is forced, every MoE sublayer recomputed."""
    bench = load_script("train_throughput")
    seen = []
    real = bench.ZayaModel.set_force_load_balancing

    def spy(model, enabled):
        seen.append((enabled, model))
        return real(model, enabled)
    bench.ZayaModel.set_force_load_balancing = spy
    try:
        assert bench.main(TINY + ["--global-batch-size", "2", "--warmup", "0", "--iters", "1",
                                  "--moe-router-force-load-balancing", "--recompute-granularity", "selective",
                                  "--recompute-modules", "moe", "--document-length", "8"]) == 0
    finally:
        bench.ZayaModel.set_force_load_balancing = real
    assert [enabled for enabled, _ in seen] == [True]
    model = seen[0][1]
    assert model.recompute_modules == ("moe",)
    assert all(block.moe.recompute_selective and block.moe.router.force_balanced for block in model.layers)
    assert "tokens/s" in capsys.readouterr().out


def test_model_throughput_runs(capsys, keep_threads):
    pytest.importorskip("transformers")
    bench = load_script("model_throughput")
    assert bench.main(["--preset", "zaya1-tiny", "--micro-batch-size", "1", "--seq-length", "32",
                       "--warmup", "0", "--iters", "1", "--dtype", "bf16"]) == 0
    assert "speed-up" in capsys.readouterr().out


def test_muon_step_and_lm_head_layouts_run(capsys, keep_threads):
    assert load_script("muon_step").main(["--preset", "zaya1-tiny", "--iters", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "Muon.step" in out and "newton_schulz" in out and "(4, 512, 128)" in out   # the stacked experts
    assert f"Newton-Schulz in {str(newton_schulz_dtype('cpu')).removeprefix('torch.')}" in out
    assert load_script("muon_step").main(["--preset", "zaya1-tiny", "--iters", "1", "--ns-dtype", "fp32"]) == 0
    assert "Newton-Schulz in float32" in capsys.readouterr().out
    from megatron_zaya.kernels import reference
    default = reference.NEWTON_SCHULZ_CPU_CHUNK_BYTES
    assert load_script("muon_step").main(["--preset", "zaya1-tiny", "--iters", "1", "--cpu-chunk-bytes", "0",
                                          str(1 << 20)]) == 0
    out = capsys.readouterr().out
    assert "whole stacks" in out and "CPU chunks of 1 MiB" in out
    assert reference.NEWTON_SCHULZ_CPU_CHUNK_BYTES == default
    assert load_script("lm_head_layouts").main(["--tokens", "64", "--hidden", "32", "--vocab", "256",
                                                "--iters", "1"]) == 0
    out = capsys.readouterr().out
    assert "rows dW^T" in out and "cols dX" in out


def test_cca_conv_bench_runs(capsys, keep_threads):
    assert load_script("cca_conv").main(["--preset", "zaya1-tiny", "--micro-batch-size", "1", "--seq-length", "16",
                                         "--iters", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "channels-last Conv2d" in out and "Conv1d on (B, C, S)" in out and "per-pair speed-up" in out
    errors = [float(line.split()[-1]) for line in out.splitlines() if "relative error" in line]
    assert len(errors) == 2 and max(errors) < 2e-2      # both pairs agree with float64 to bf16 rounding


def test_muon_step_against_a_baseline_tree(capsys, keep_threads, tmp_path):
    """--baseline-tree imports another checkout's Muon beside this one's: a copy of this package gives the
    same parameters to the last bit, and this tree's modules are the ones left imported afterwards."""
    import megatron_zaya.optim.muon as muon

    shutil.copytree(Path(muon.__file__).parents[1], tmp_path / "megatron_zaya",
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert load_script("muon_step").main(["--preset", "zaya1-tiny", "--iters", "1", "--threads", "1",
                                          "--baseline-tree", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"baseline ({tmp_path})" in out and "largest parameter difference after 2 steps 0.00e+00" in out
    import megatron_zaya.optim.muon as after
    assert after is muon
    with pytest.raises(SystemExit, match="no megatron_zaya/optim/muon.py"):
        load_script("muon_step").main(["--preset", "zaya1-tiny", "--baseline-tree", str(tmp_path / "none")])


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not installed")
def test_packed_documents_bench_runs(capsys):
    assert load_script("packed_documents").main(["--preset", "zaya1-tiny", "--micro-batch-size", "1",
                                                 "--seq-length", "32", "--document-length", "8", "--repeats", "1",
                                                 "--trials", "1"]) == 0
    out = capsys.readouterr().out
    assert "plain (two Conv1d)" in out and "segmented (restarts per document)" in out


def test_completions_latency_bench_runs(capsys, keep_threads):
    assert load_script("completions_latency").main(["--preset", "zaya1-tiny", "--prompt-lengths", "5", "9",
                                                     "--max-tokens", "0", "2", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "| 0 |" in out and "| 2 |" in out
    assert load_script("completions_latency").main(["--preset", "zaya1-tiny", "--prompt-lengths", "2", "3",
                                                     "--shared-prefix", "8", "--questions", "2", "--question-length",
                                                     "4", "--max-tokens", "0", "--repeats", "1"]) == 0
    assert "4 prompts of 58 tokens in all (8 shared by all, 2 questions of 4)" in capsys.readouterr().out


def test_stream_text_bench_runs(tmp_path, capsys):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE(unk_token="<unk>"))
    hf.pre_tokenizer, hf.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    hf.train_from_iterator(["a small corpus of words, a few words"] * 20, trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>", "<unk>"]))
    hf.save(str(tmp_path / "tokenizer.json"))
    assert load_script("stream_text").main(["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                                            str(tmp_path / "tokenizer.json"), "--tokens", "40", "--repeats", "1"]) == 0
    assert "| 40 |" in capsys.readouterr().out


def test_sdpa_backends_bench_runs(capsys):
    assert load_script("sdpa_backends").main(["--seq-length", "64", "--head-dim", "16"]) == 0
    out = capsys.readouterr().out
    assert "| causal |" in out and "| packed documents (bias) |" in out and "lower-right" in out


def test_cpu_attention_bench_runs(capsys, keep_threads):
    assert load_script("cpu_attention").main(["--shape", "1,4,2,40,16", "--block-rows", "32", "64", "--iters", "1"]) == 0
    out = capsys.readouterr().out
    assert "SDPA flash" in out and "blocked backward (32 rows)" in out and "blocked backward (64 rows)" in out


def test_qk_norm_bench_runs(capsys, keep_threads):
    assert load_script("qk_norm").main(["--shape", "1,8,4,2,16", "--iters", "1"]) == 0
    assert "1,8,4,2,16" in capsys.readouterr().out


def test_norms_bench_runs_and_restores_the_written_out_ops(capsys, keep_threads):
    from megatron_zaya.kernels import reference

    written = (reference.rms_norm, reference.scaled_residual_add)
    norms = load_script("norms")
    assert norms.main(["--shape", "1,8,16", "--iters", "1"]) == 0
    assert norms.main(["--model", "zaya1-tiny", "--micro-batch-size", "1", "--seq-length", "16", "--iters", "1",
                       "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "1,8,16" in out and "paired ratio" in out
    assert (reference.rms_norm, reference.scaled_residual_add) == written


def test_train_throughput_two_processes_expert_parallel(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", MEGATRON_ZAYA_KERNELS="torch")
    cmd = ["torchrun", "--standalone", "--nproc-per-node", "2", "bench/train_throughput.py", *TINY,
           "--warmup", "0", "--iters", "1", "--expert-model-parallel-size", "2", "--json", str(tmp_path / "r.json")]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["world_size"] == 2 and report["layout"]["ep"] == 2
    assert report["split_s"]["communication"] > 0


def test_gpu_model_check_runs_interpreted_in_bf16():
    """bench/gpu_model_check.py without a GPU: the Triton kernels interpreted inside a one-layer
    model under bf16 autocast, against the reference path (its own process: the script sets
    TRITON_INTERPRET=1 before triton is imported). Before _triton_common.dot_operand the
    interpreter's bf16 tl.dot made this check fail with relative gradient errors of ~1e15.
    32 tokens (2 x 16): on a CPU with native bf16 matmuls (AVX512-BF16) the interpreted path's
    gradient errors against float64 are 1.6-1.8x eager's, and with 8 tokens a few small tensors
    (key_temperature, router biases) went past the 2x verdict by chance (2026-12-04, seed 0)."""
    pytest.importorskip("triton")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "bench/gpu_model_check.py", "--preset", "zaya1-tiny", "--num-layers", "1",
           "--vocab-size", "1024", "--seq-length", "16", "--micro-batch-size", "2", "--dtype", "bf16", "--iters", "0"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[bf16] gradients: 34 tensors" in proc.stdout and "model check: PASS" in proc.stdout


def test_blending_indices_bench_runs(capsys):
    from megatron_zaya.data.native_blending import native_blending
    if native_blending() is None:
        pytest.skip("no working C compiler here")
    assert load_script("blending_indices").main(["--samples", "2000", "--datasets", "2", "5"]) == 0
    assert "| 5 |" in capsys.readouterr().out


def test_sample_index_bench_runs(capsys):
    assert load_script("sample_index").main(["--documents", "1000"]) == 0
    assert "chunked: " in capsys.readouterr().out


def test_data_startup_bench_runs(tmp_path, capsys):
    assert load_script("data_startup").main(["--sequences", "20000", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "20,000 sequences: first start" in out and "restart" in out
    assert any(name.endswith("-IndexCheck-description.json") for name in os.listdir(tmp_path / "cache"))


def test_matmul_ceiling_records_the_models_matmuls(capsys, keep_threads):
    """bench/matmul_ceiling.py's recorder sees every matmul of a bf16 forward+backward: their FLOPs cover the
    linear layers' 6 x multiply-adds per token (attention projections, router, the active expert, LM head;
    its backward's attention bmms and the experts' padded rows add a little), and the script reports."""
    bench = load_script("matmul_ceiling")
    from megatron_zaya.config import model_config_from_preset
    from megatron_zaya.model import ZayaModel
    from megatron_zaya.model.accounting import matmul_macs_per_token, training_flops_per_token

    config = model_config_from_preset("zaya1-tiny", num_layers=2, seq_length=64)
    model = ZayaModel(config).train()
    tokens, labels = (torch.randint(0, config.vocab_size, (4, 64)) for _ in range(2))
    recorder = bench.RecordComputeOps()
    with recorder:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(tokens, labels=labels).token_losses.mean()
        loss.backward()
    recorded = sum(call["flops"] * call["count"] for call in recorder.calls.values())
    macs = matmul_macs_per_token(config)
    linear = 6 * (sum(macs.values()) - macs["cca_convolutions"]) * tokens.numel()
    assert linear <= recorded <= 1.3 * training_flops_per_token(config, 64) * tokens.numel()
    assert {call["kind"] for call in recorder.calls.values()} >= {"matmul", "matmul (grouped experts)", "convolution"}

    assert bench.main(TINY + ["--iters", "1", "--repeats", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "ceiling MFU" in out and "matmul (grouped experts)" in out


def test_recompute_memory_measures_what_the_forward_keeps(tmp_path, keep_threads):
    """The allocator sees what a choice keeps: recomputing the MoE sublayer keeps less than nothing
    recomputed, and adding moe_act to moe keeps no more than moe alone (it kept 50% more until moe
    turned moe_act off inside the rerun sublayer)."""
    bench = load_script("recompute_memory")
    out = tmp_path / "r.json"
    assert bench.main(["--num-layers", "2", "--seq-length", "64", "--hidden-size", "128",
                       "--moe-ffn-hidden-size", "256", "--vocab-size", "512",
                       "--modules", "none", "moe", "moe_act moe", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert rows["moe"]["kept"] < 0.8 * rows["none"]["kept"]
    assert rows["moe_act moe"]["kept"] < 1.05 * rows["moe"]["kept"]
    for row in rows.values():
        assert row["peak"] >= row["kept"] > 0 and row["planner_kept"] > 0


def test_params_norm_bench_prints_both_norms(capsys, keep_threads):
    bench = load_script("params_norm")
    assert bench.main(["--preset", "zaya1-tiny", "--repeats", "1"]) == 0
    norms = [float(line.split("norm ")[-1]) for line in capsys.readouterr().out.splitlines() if "median" in line]
    assert len(norms) == 2 and abs(norms[0] - norms[1]) <= 1e-6 * norms[0]
