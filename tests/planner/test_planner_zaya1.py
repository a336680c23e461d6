"""The planner against the published ZAYA1 facts (spec/zaya1.md), and the CLI.

Facts: ZAYA1-base trains on 1024 MI300X (192 GB) with DP + ZeRO-1 at 4K context (no TP, no EP); the
32K phase needed context parallelism with 2 ranks
(the planner: or selective recomputation, by a small margin); a global batch of 4096 x 4096 tokens took about
2.5 s per step. The planner runs with its documented default assumptions (docs/PLANNER.md)."""
import json
from pathlib import Path

import pytest

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model.accounting import count_parameters, training_flops_per_token
from megatron_zaya.planner import CLUSTERS, PEAK_BF16_TFLOPS, Efficiency, ParallelLayout
from megatron_zaya.planner.plan import fixes, make_plan
from megatron_zaya.planner.time import ring_time

ROOT = Path(__file__).resolve().parents[2]
BASE = model_config_from_preset("zaya1-base", max_position_embeddings=131072)
MI300X = CLUSTERS["mi300x"]


def test_zaya1_base_fits_one_mi300x_with_dp_and_zero1_at_4k():
    plan = make_plan(BASE, ParallelLayout(1024, 4096, 1, 4096, zero1=True), MI300X)
    assert plan.fits
    counts = count_parameters(BASE)
    router = 40 * 660_992 - 256                                           # the first router has no EDA gamma
    assert plan.state.weights == 2 * counts.total + 2 * router            # bf16, router fp32
    assert plan.state.gradients == 4 * counts.total
    assert plan.memory_total < 0.5 * MI300X.memory_bytes                  # 70 GB of 192 GiB (206.2 GB)
    # Without ZeRO-1 the fp32 weights (their own masters), AdamW's moments (8 bytes/param, 70.7 GB) and autocast's
    # bf16 weight copies (17.4 GB) still fit at micro batch 1 (175.6 GB of 185.5 usable), not at micro batch 2,
    # where the first remedy offered is ZeRO-1.
    plain = make_plan(BASE, ParallelLayout(1024, 4096, 1, 4096, zero1=False), MI300X)
    assert plain.fits and plain.memory_total > 2.5 * plan.memory_total
    plain2 = make_plan(BASE, ParallelLayout(1024, 4096, 2, 4096, zero1=False), MI300X)
    assert not plain2.fits
    assert fixes(plain2)[0][0].startswith("enable ZeRO-1")


def test_zaya1_32k_phase_needs_cp2():
    cp1 = make_plan(BASE, ParallelLayout(1024, 32768, 1, 1024, zero1=True), MI300X)
    cp2 = make_plan(BASE, ParallelLayout(1024, 32768, 1, 1024, context_parallel=2, zero1=True), MI300X)
    assert not cp1.fits and cp2.fits
    # By a small margin: CP=1 needs 185.9 GB, 90.2% of the 192 GiB (206.2 GB), over the 185.5 GB left by the
    # default 10% reserve (the runtime's context, allocator slack and communication buffers).
    assert 0.9 * MI300X.memory_bytes < cp1.memory_total < 0.91 * MI300X.memory_bytes
    # The fixes: selective recomputation (no matmul runs twice) first, which brings CP=1 to 177.8 GB, then
    # CP=2 (what ZAYA1 did), with room to spare.
    offered = [text for text, _ in fixes(cp1)]
    assert offered[0].startswith("recompute selective") and offered[1].startswith("raise CP to 2")
    # CP halves the tokens each rank holds: activations nearly halve, to 51% (the gathered K/V stay whole,
    # the halo keeps a second stacked projection weight).
    assert 0.45 < cp2.activations.stored / cp1.activations.stored < 0.55


def test_zaya1_step_time_about_2_5_s_on_1024_gpus():
    plan = make_plan(BASE, ParallelLayout(1024, 4096, 1, 4096, zero1=True), MI300X)
    assert 2.5 / 1.5 < plan.time.total < 2.5 * 1.5, plan.time
    # The step is communication-bound: the ZeRO-1 reduce-scatter of fp32 gradients + bf16 weight
    # all-gather over 1024 ranks costs more than the compute of 16 sequences per GPU.
    assert plan.time.dp_comm_exposed > plan.time.compute
    flops = training_flops_per_token(BASE, 4096) * 4096 * 4096 / 1024
    assert abs(plan.time.model_flops_per_gpu - flops) < 1
    assert abs(plan.mfu - flops / (plan.time.total * 1307e12)) < 1e-12


def test_ring_costs_and_device_table():
    eff = Efficiency(intra_node=1.0, inter_node=1.0)
    # all-reduce inside a node: 2 (n-1)/n bytes at the fabric rate; across nodes: at the NIC rate
    assert abs(ring_time(8e9, 8, 1, MI300X, eff, passes=2) - 2 * 7 / 8 * 8e9 / 448e9) < 1e-12
    assert abs(ring_time(8e9, 16, 1, MI300X, eff) - 15 / 16 * 8e9 / 50e9) < 1e-12
    hier = ring_time(8e9, 16, 1, MI300X, eff, hierarchical=True)
    assert abs(hier - (7 / 8 * 8e9 / 448e9 + 1 / 2 * 1e9 / 50e9)) < 1e-12
    assert PEAK_BF16_TFLOPS == {"mi300x": 1307.0, "mi325x": 1307.0, "mi355x": 2516.6, "h100": 989.0,
                                "h200": 989.0, "a100": 312.0}


def test_cli_reports_and_names_bad_flags(cli, capsys):
    base = ["--preset", "zaya1-base", "--gpus", "1024", "--cluster", "mi300x", "--micro-batch-size", "1"]
    assert cli.main(base + ["--seq-length", "32768", "--global-batch-size", "1024", "--use-distributed-optimizer",
                            "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert not result["fits"] and result["fixes"][1].startswith("raise CP to 2")
    assert cli.main(base + ["--seq-length", "4096", "--global-batch-size", "4096", "--use-distributed-optimizer"]) == 0
    out = capsys.readouterr().out
    assert "FITS" in out and "tokens/s" in out and "ZeRO-1=on" in out
    with pytest.raises(SystemExit) as exit_info:
        cli.main(base + ["--global-batch-size", "1000"])
    assert exit_info.value.code == 2 and "--global-batch-size=1000" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:     # not the preset's 4096 in its place
        cli.main(base + ["--global-batch-size", "1024", "--seq-length", "0"])
    assert exit_info.value.code == 2 and "--seq-length=0: must be >= 1" in capsys.readouterr().err


def test_cli_plans_tp_with_and_without_sequence_parallelism(cli, capsys, tmp_path):
    """Without --sequence-parallel the residuals', norms' and router's activations are whole on each TP
    rank: the plan keeps more, and a layout that does not fit is offered --sequence-parallel first after
    ZeRO-1. A training config's sequence-parallel key counts."""
    base = ["--preset", "zaya1-tiny", "--gpus", "2", "--global-batch-size", "8", "--tensor-model-parallel-size", "2",
            "--json"]
    cli.main(base)
    without = json.loads(capsys.readouterr().out)
    cli.main(base + ["--sequence-parallel"])
    with_sp = json.loads(capsys.readouterr().out)
    assert without["activations_gb"] > 1.2 * with_sp["activations_gb"]
    config = tmp_path / "tp2.yaml"
    config.write_text("tensor-model-parallel-size: 2\nsequence-parallel: true\nbf16: true\n")
    cli.main(["--preset", "zaya1-tiny", "--gpus", "2", "--global-batch-size", "8", "--config", str(config)])
    out, err = capsys.readouterr()
    assert "layout: TP=2 (sequence parallel)" in out and "sequence-parallel" not in err, err
    # ZAYA1-base at 32K, micro batch 2, TP 2 and ZeRO-1 fits with SP only (MI300X); it is the first fix offered.
    zaya1_base = ["--preset", "zaya1-base", "--gpus", "1024", "--seq-length", "32768", "--global-batch-size", "1024",
                  "--micro-batch-size", "2", "--tensor-model-parallel-size", "2", "--use-distributed-optimizer",
                  "--json"]
    assert cli.main(zaya1_base + ["--sequence-parallel"]) == 0
    capsys.readouterr()
    code = cli.main(zaya1_base)
    plan = json.loads(capsys.readouterr().out)
    assert code == 1 and plan["fixes"][0].endswith("(--sequence-parallel)"), plan["fixes"]


def test_cli_refuses_a_partial_node(cli, capsys):
    base = ["--preset", "zaya1-tiny", "--global-batch-size", "16"]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(base + ["--gpus", "8", "--gpus-per-node", "3"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2 and "--gpus=8" in line and "--gpus-per-node=3" in line, line
    cli.main(base + ["--gpus", "4", "--gpus-per-node", "8"])     # within one node: allowed, said plainly
    assert "1 node, 4 of its 8 GPUs" in capsys.readouterr().out


def test_cli_counts_packed_documents_and_module_recomputation(cli, capsys):
    """--reset-attention-mask adds the segmented convolution's terms and the attention bias: under CP=2 at 32K,
    the bias is the two chunk biases, (2 CP + 1) (S / 2CP)^2 bf16 per sequence, and the planner's total is pinned.
    --recompute-modules reaches the report."""
    from megatron_zaya.planner.activations import document_bias_bytes
    base = ["--preset", "zaya1-base", "--gpus", "1024", "--cluster", "mi300x", "--micro-batch-size", "1",
            "--seq-length", "32768", "--global-batch-size", "1024", "--use-distributed-optimizer",
            "--context-parallel-size", "2", "--json"]
    results = []
    for extra in ([], ["--reset-attention-mask"]):
        assert cli.main(base + extra) == 0
        results.append(json.loads(capsys.readouterr().out))
    plain, packed = results
    bias = document_bias_bytes(32768, 1, 2)
    assert bias == 2 * 5 * 8192 ** 2
    assert bias / 1e9 < packed["activations_gb"] - plain["activations_gb"] < bias / 1e9 + 15
    # The repeated K/V are kept once for both chunks (parallel/context.py): 126.3 GB when each chunk kept its own.
    assert round(packed["memory_total_gb"], 2) == 124.97, packed["memory_total_gb"]
    assert cli.main(base[:-1] + ["--recompute", "selective", "--recompute-modules", "moe"]) == 0
    assert "recompute=selective (moe)" in capsys.readouterr().out
    # the training flags' names work too
    assert cli.main(base[:-1] + ["--recompute-granularity", "selective", "--recompute-modules", "moe"]) == 0
    assert "recompute=selective (moe)" in capsys.readouterr().out


def test_cli_plans_the_training_config(cli, capsys, tmp_path):
    """--config FILE.yaml: the ZAYA1-base 32K recipe plans exactly as the same flags given by hand; its
    training-only keys are listed as left out; the command line wins; a key pretrain_zaya.py does not know,
    and a partial full recomputation the planner does not model, are refused naming them."""
    recipe = str(ROOT / "examples" / "zaya1_base" / "phase3_32k.yaml")
    assert cli.main(["--config", recipe, "--gpus", "1024", "--cluster", "mi300x", "--json"]) == 0
    captured = capsys.readouterr()
    from_file = json.loads(captured.out)
    assert "left out: rotary-base, train-iters, lr," in captured.err and "trains in fp32" not in captured.err
    assert cli.main(["--preset", "zaya1-base", "--gpus", "1024", "--cluster", "mi300x", "--seq-length", "32768",
                     "--context-parallel-size", "2", "--use-distributed-optimizer", "--global-batch-size", "512",
                     "--micro-batch-size", "1", "--optimizer", "muon", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == from_file
    assert cli.main(["--config", recipe, "--gpus", "1024", "--context-parallel-size", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["data_parallel"] == 256
    config = tmp_path / "run.yaml"
    config.write_text("preset: zaya1-base\nglobal-batch-size: 1024\nrecompute-activations: true\n"
                      "ffn-hidden-size: 1024\n")
    assert cli.main(["--config", str(config), "--gpus", "1024", "--seq-length", "4096"]) == 0
    captured = capsys.readouterr()
    assert "recompute=selective" in captured.out
    assert "the run trains in fp32 (no bf16: true), while the plan assumes --bf16" in captured.err
    assert "optimizer muon" in captured.out            # no optimizer key: training's default, not the planner's
    assert cli.main(["--config", str(config), "--gpus", "1024", "--seq-length", "4096", "--optimizer", "adam"]) == 0
    assert "optimizer adamw" in capsys.readouterr().out     # Megatron-LM's adam, accepted by training too
    assert "the planner does not read" not in captured.err
    config.write_text(config.read_text() + "tokenizer-model: tok.model\n")     # the vocabulary is the tokenizer's
    assert cli.main(["--config", str(config), "--gpus", "1024", "--seq-length", "4096"]) == 0
    assert "the run's vocabulary is its tokenizer's, which the planner does not read" in capsys.readouterr().err
    assert cli.main(["--config", str(config), "--gpus", "1024", "--seq-length", "4096", "--vocab-size", "1024"]) == 0
    assert "the planner does not read" not in capsys.readouterr().err
    assert cli.main(["--config", str(config), "--gpus", "1024", "--seq-length", "4096", "--moe-ffn-hidden-size",
                     "1024", "--json"]) == 0
    by_flag = json.loads(capsys.readouterr().out)
    assert cli.main(["--config", str(config), "--gpus", "1024", "--seq-length", "4096", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == by_flag        # --ffn-hidden-size sized the experts
    for text, message in (("learning_rate: 0.1\n", "unknown key 'learning_rate'"),
                          ("recompute-granularity: full\nrecompute-method: block\nrecompute-num-layers: 4\n",
                           "--recompute-method block --recompute-num-layers 4: the planner models")):
        config.write_text("global-batch-size: 1024\n" + text)
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["--config", str(config), "--gpus", "1024"])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
