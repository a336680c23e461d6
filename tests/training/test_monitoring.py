"""Monitoring details: the MFU peak table, the progress bar, --exit-duration-in-mins."""
import re
import sys
import time

import pytest
import torch

from megatron_zaya.arguments import parse_args
from megatron_zaya.training import metrics
from megatron_zaya.training.setup import build_and_train
from megatron_zaya.units import format_duration
from tests.training.helpers import tiny_run_flags


def test_mfu_peak_from_the_device_table(monkeypatch):
    names = iter(["NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
                  "NVIDIA H200 NVL", "AMD Instinct MI300X", "Some Future GPU"])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: next(names))
    monkeypatch.setattr(metrics, "measure_matmul_tflops", lambda *a, **k: 42.0)
    cuda = torch.device("cuda")
    assert metrics.device_peak_tflops(cuda) == (989.0, "table (H200)")
    assert metrics.device_peak_tflops(cuda) == (989.0, "table (H100)")
    assert metrics.device_peak_tflops(cuda) == (756.0, "table (H100PCIE)")
    assert metrics.device_peak_tflops(cuda) == (835.0, "table (H100NVL)")
    assert metrics.device_peak_tflops(cuda) == (835.0, "table (H200NVL)")     # (it read the SXM part's 989)
    assert metrics.device_peak_tflops(cuda) == (1307.0, "table (MI300X)")
    assert metrics.device_peak_tflops(cuda) == (42.0, "measured matmul (Some Future GPU)")


def test_mfu_peak_on_rocm_from_the_architecture_and_compute_units(monkeypatch):
    """ROCm shows each MI250X die and each MI300X partition as a device, and may name an MI300X generically: the
    peak is the architecture's per compute unit times the device's units; an unknown architecture goes by name."""
    from types import SimpleNamespace
    devices = iter([("gfx942:sramecc+:xnack-", 304, "AMD Radeon Graphics"), ("gfx942", 38, "AMD Instinct MI300X"),
                    ("gfx90a:sramecc+:xnack-", 110, "AMD Instinct MI250X / MI250"),
                    ("gfx950", 256, "AMD Instinct MI355X")])
    current = {}

    def name(device=None):          # (asked first: the next device)
        current["arch"], current["units"], current["name"] = next(devices)
        return current["name"]
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    monkeypatch.setattr(torch.cuda, "get_device_name", name)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(
        gcnArchName=current["arch"], multi_processor_count=current["units"]))
    cuda = torch.device("cuda")
    assert metrics.device_peak_tflops(cuda) == (pytest.approx(1307.4), "table (gfx942, 304 compute units)")
    assert metrics.device_peak_tflops(cuda)[0] == pytest.approx(1307.4 / 8)     # one partition of 8 (CPX)
    assert metrics.device_peak_tflops(cuda) == (pytest.approx(191.5), "table (gfx90a, 110 compute units)")  # a die
    assert metrics.device_peak_tflops(cuda) == (2516.6, "table (MI355X)")


def test_progress_bar_line(tiny_corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)       # (captured: a terminal for the bar)
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": 3, "--eval-iters": 0,
                                                               "--progress-bar": ""}))
    assert build_and_train(run) == 0
    captured = capsys.readouterr()
    assert re.search(r"train: 100%\|.*\| 3/3 \[.*loss=\d+\.\d{3}\]", captured.err), captured.err[-500:]
    assert "iteration        3/       3" in captured.out + captured.err      # console lines go through the bar


def test_without_a_terminal_the_progress_bar_is_not_drawn(tiny_corpus, tmp_path, capsys):
    """--progress-bar with stderr in a file (a Slurm output, CI): no carriage-return redraws, the console lines
    as without the flag."""
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": 3, "--eval-iters": 0,
                                                               "--progress-bar": ""}))
    assert build_and_train(run) == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.err and "train:" not in captured.err, captured.err[-500:]
    assert "iteration        3/       3" in captured.out


def test_a_launcher_piping_to_a_terminal_gets_the_bar(tiny_corpus, tmp_path, capsys, monkeypatch):
    """examples/quickstart_cpu.sh shows the run on its terminal through tee: stderr is a pipe, and the variable
    it sets draws the bar anyway."""
    monkeypatch.setenv("MEGATRON_ZAYA_PROGRESS_BAR_BEHIND_PIPE", "1")
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": 3, "--eval-iters": 0,
                                                               "--progress-bar": ""}))
    assert build_and_train(run) == 0
    assert re.search(r"train: 100%\|.*\| 3/3 \[", capsys.readouterr().err)


def test_with_ramp_up_the_progress_bar_counts_samples(tiny_corpus, tmp_path, capsys, monkeypatch):
    """Ramp-up iterations grow (2, 2, 4, 4, ... samples): the bar counts samples, so its rate and ETA hold."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": None, "--train-samples": 16,
                                                               "--rampup-batch-size": ["2", "2", "8"],
                                                               "--eval-iters": 0, "--progress-bar": ""}))
    assert build_and_train(run) == 0
    assert re.search(r"train: 100%\|.*\| 16/16 \[", capsys.readouterr().err)


def test_the_eta_counts_the_samples_left():
    """BatchSizeSchedule.samples_consumed (the ETA's remaining work, per log line) equals the step-by-step sum,
    in closed form after the ramp-up: a 700K-iteration run asked it at every log interval."""
    from megatron_zaya.training.batch_schedule import BatchSizeSchedule

    schedule = BatchSizeSchedule(32, 2, 2, [4, 4, 200])
    for start, iterations in ((0, 0), (0, 3), (0, 100), (37, 50), (10_000, 7)):
        consumed = start
        for _ in range(iterations):
            consumed += schedule.batch_size(consumed)
        assert schedule.samples_consumed(start, iterations) == consumed - start
    assert BatchSizeSchedule(16, 2, 2).samples_consumed(5, 700_000) == 16 * 700_000


def test_exit_duration_exits_and_saves(tiny_corpus, tmp_path, capsys, monkeypatch):
    """The time counts from the start of build_and_train, start-up included (Megatron-LM counts from the
    process's start), and the run exits as Megatron's does: a checkpoint, no final or test evaluation (a job
    sized to its time limit overran it by those)."""
    from megatron_zaya.training import setup

    save = tmp_path / "ckpt"
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--save": save, "--exit-duration-in-mins": 0.02}))
    real_build = setup.build_model

    def slow_build(*args, **kwargs):    # a start-up longer than the 1.2 s budget: the first step is the last
        time.sleep(1.5)
        return real_build(*args, **kwargs)
    monkeypatch.setattr(setup, "build_model", slow_build)
    assert build_and_train(run) == 0
    out = capsys.readouterr().out
    assert "exiting: --exit-duration-in-mins 0.02 reached" in out
    assert "iteration        1/       6" in out and "iteration        2/       6" not in out
    assert "skipping the final evaluation (--exit-duration-in-mins 0.02 reached)" in out
    assert "validation" not in out and "test loss" not in out
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == "1"


def _stub_trainer(**fields):
    """A stand-in for Trainer's self in its stateless methods (should_exit, throughput)."""
    from types import SimpleNamespace
    return SimpleNamespace(**fields)


def test_exit_duration_counts_minutes_and_the_slowest_rank_decides():
    """Trainer.should_exit with --exit-duration-in-mins 1: the limit is 60 s (the flag is minutes, Megatron-LM's
    `train_time > args.exit_duration_in_mins * 60`), and every rank exits when ANY rank is over it
    (max over the ranks: a rank exiting alone leaves the others hung in the next collective). Reference: the
    flag's definition; the elapsed times (30 s, 61 s) are 30 s away from the limit, so clock jitter is irrelevant."""
    from types import SimpleNamespace

    from megatron_zaya.training.loop import Trainer

    seen = []

    def max_over_all_ranks(others_over):
        def reduce(local):
            seen.append(local.item())
            return torch.maximum(local, torch.tensor(float(others_over)))
        return reduce

    def trainer(elapsed_seconds, others_over=False):
        cfg = SimpleNamespace(exit_interval=None, exit_duration_in_mins=1.0)
        return _stub_trainer(state=SimpleNamespace(iteration=5), stop_requested=None, cfg=cfg,
                             run_started=time.time() - elapsed_seconds,
                             parallel=SimpleNamespace(max_over_all_ranks=max_over_all_ranks(others_over)))

    assert Trainer.should_exit(trainer(30.0)) is None                 # 30 s < 1 min
    assert Trainer.should_exit(trainer(61.0)) == "--exit-duration-in-mins 1.0 reached"
    # this rank is within the limit, another rank is over it: exit with it
    assert Trainer.should_exit(trainer(30.0, others_over=True)) == "--exit-duration-in-mins 1.0 reached"
    assert seen == [0.0, 1.0, 0.0]       # each rank contributes its own verdict to the max


def test_throughput_is_per_device_and_mfu_is_over_the_peak():
    """Trainer.throughput: tokens/s per device = tokens / seconds / world size; TFLOP/s per device = that x
    model FLOPs per token / 1e12; MFU = TFLOP/s / peak. Reference: hand arithmetic (8000 tokens in 2 s on 2
    devices = 2000 tokens/s/device; x 1e9 FLOPs/token = 2 TFLOP/s; / 100 peak = 0.02); tolerance 1e-12 relative."""
    from types import SimpleNamespace

    from megatron_zaya.training.loop import Trainer

    stub = _stub_trainer(parallel=SimpleNamespace(world_size=2), flops_per_token=1e9, peak_tflops=100.0)
    assert Trainer.throughput(stub, 8000, 2.0) == pytest.approx((2000.0, 2.0, 0.02), rel=1e-12)


def test_routing_statistics_of_a_hand_made_count():
    """metrics.routing_statistics on counts [2, 4, 6, 0 | skip 8] (4 experts, 20 tokens). References: skip_rate
    = skipped / ALL tokens = 8/20 (the console's skip column, over every token); CV = population std / mean over
    the experts (statistics.pstdev: sqrt(5)/3, not the sample std sqrt(20/3)/3); entropy of the routed shares
    (2, 4, 6, 0)/12 over log(4 experts); min 0, max 6. Tolerance 1e-12 relative."""
    import math
    import statistics

    stats = metrics.routing_statistics(torch.tensor([2, 4, 6, 0, 8]))
    experts = [2, 4, 6, 0]
    shares = [c / 12 for c in experts if c]
    assert stats == pytest.approx({
        "tokens_per_expert_min": 0.0, "tokens_per_expert_max": 6.0,
        "tokens_per_expert_cv": statistics.pstdev(experts) / statistics.mean(experts),
        "routing_entropy": -sum(p * math.log(p) for p in shares) / math.log(4),
        "skip_rate": 8 / 20}, rel=1e-12)


def test_interval_meter_averages_and_durations():
    m = metrics.IntervalMeter()
    m.add(2.0, 0.5, 100, skipped=False)
    m.add(float("nan"), 1.5, 100, skipped=True)      # a skipped step: time and tokens count, its loss does not
    m.add(4.0, 1.0, 100, skipped=False)
    assert (m.mean_loss, m.seconds_per_iteration, m.tokens_per_second(), m.skipped) == (3.0, 1.0, 100.0, 1)
    assert [format_duration(s) for s in (5, 75, 12345)] == ["5s", "1m15s", "3h25m45s"]


def test_straggler_report_names_the_ends_and_the_ratio():
    from megatron_zaya.training.stragglers import StragglerReport
    report = StragglerReport([0.5, 2.0, 0.4, 1.0], count=2)
    assert report.line() == ("stragglers (forward+backward per iteration): slowest ranks 1 2.000 s, 3 1.000 s | "
                             "fastest ranks 2 0.400 s, 0 0.500 s | slowest/fastest 5.00x")
    assert report.scalars() == {"straggler/max-seconds": 2.0, "straggler/min-seconds": 0.4, "straggler/ratio": 5.0}


def test_straggler_meter_reports_each_intervals_mean_forward_backward(monkeypatch):
    """StragglerMeter.report gives this rank's MEAN forward+backward seconds per iteration over the interval since
    the last report (then starts a new interval). Reference: a patched perf_counter, steps of 1 s and 3 s (mean 2 s)
    then one of 0.5 s; gather over one rank is [x]. Exact (binary fractions)."""
    from types import SimpleNamespace

    from megatron_zaya.training import stragglers

    clock = [10.0]
    monkeypatch.setattr(stragglers, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    meter = stragglers.StragglerMeter(torch.device("cpu"), count=1)
    runtime = SimpleNamespace(gather_from_all_ranks=lambda x: [x])
    reports = []
    for steps in ((1.0, 3.0), (0.5,)):
        for seconds in steps:
            meter.start()
            clock[0] += seconds
            meter.stop()
        reports.append(meter.report(runtime).seconds)
    assert reports == [[2.0], [0.5]]


def test_progress_log_throughput_is_per_gpu_for_the_job_and_cumulative(tmp_path):
    """progress.txt's "Job throughput" counts only this job's FLOPs and seconds (those since job_started), the
    "Cumulative throughput" the whole run's, both per GPU (Megatron-LM divides by the world size). Reference:
    hand arithmetic with world size 2: a job from (1e15 FLOPs, 10 s) to (3e15, 20 s) is 2e15 / 10 s / 2 GPUs =
    100 TFLOP/s/GPU; cumulative 3e15 / 20 s / 2 = 75 TFLOP/s/GPU (printed with one decimal: exact)."""
    from types import SimpleNamespace

    from megatron_zaya.training.progress_log import ProgressLog

    log = ProgressLog(str(tmp_path), world_size=2, is_main=True)
    log.job_started(SimpleNamespace(floating_point_operations=1e15, train_seconds=10.0))
    log.checkpoint_saved(SimpleNamespace(floating_point_operations=3e15, train_seconds=20.0, iteration=7,
                                         consumed_tokens=0))
    lines = (tmp_path / "progress.txt").read_text().splitlines()
    assert [line.split("\t")[2:4] for line in lines] == [["# GPUs: 2", "Starting job"],
                                                          ["# GPUs: 2", "Saved checkpoint"]]
    fields = dict(f.split(": ", 1) for f in lines[1].split("\t")[4:])
    assert fields["Job throughput"] == "100.0 TFLOP/s/GPU"
    assert fields["Cumulative throughput"] == "75.0 TFLOP/s/GPU"


def test_log_progress_appends_each_job_and_checkpoint(tiny_corpus, tmp_path, capsys):
    """--log-progress: progress.txt in --save gets "Starting job" per job and one line per checkpoint,
    with cumulative FLOPs and tokens that continue across a resumed job (Megatron-LM's format); an
    asynchronous save is logged when it starts and again when it is complete."""
    save = tmp_path / "ckpt"
    flags = {"--eval-iters": 0, "--save": save, "--load": save, "--save-interval": 2, "--log-progress": ""}
    assert build_and_train(parse_args(tiny_run_flags(tiny_corpus, tmp_path, **flags, **{"--train-iters": 4}))) == 0
    assert build_and_train(parse_args(tiny_run_flags(tiny_corpus, tmp_path, **flags, **{"--train-iters": 6,
                                                                                         "--async-save": ""}))) == 0
    lines = (save / "progress.txt").read_text().splitlines()
    events = [line.split("\t")[3] for line in lines]
    assert events == ["Starting job", "Saved checkpoint", "Saved checkpoint",
                      "Starting job", "Started async checkpoint", "Saved checkpoint"]
    assert all(line.split("\t")[2] == "# GPUs: 1" for line in lines)
    fields = dict(f.split(": ", 1) for f in lines[-1].split("\t")[4:])
    assert fields["Iteration"] == "6"
    per_token = float(re.search(r"model FLOPs/token ([0-9.e+]+)", capsys.readouterr().out).group(1))
    assert float(fields["Floating-point operations"]) == pytest.approx(6 * 4 * 32 * per_token, rel=1e-2)
    assert fields["Job throughput"].endswith(" TFLOP/s/GPU") and fields["Tokens (in billions)"] == "0.00"


def test_log_progress_or_save_flags_without_save_warn(tiny_corpus, tmp_path):
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--log-progress": ""}))
    assert "--log-progress without --save: nothing is written (progress.txt goes into the --save folder)" in run.warnings
    assert not any("without --save: no checkpoint" in w for w in run.warnings)
    # Megatron-LM also saves nothing without --save; said, as a lost --save (an empty $CKPT_DIR) loses a run
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--save-interval": 2, "--async-save": ""}))
    assert "--save-interval, --async-save without --save: no checkpoint is written, so this run cannot be resumed" \
        in run.warnings
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--save-interval": 2, "--save": tmp_path / "ck"}))
    assert run.warnings == []


def test_empty_unused_memory_level(monkeypatch, tiny_corpus, tmp_path):
    """--empty-unused-memory-level: level 1 empties the GPU cache after forward+backward, level 2 also
    after the optimizer step; never on CPU."""
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    for level, where, called in ((0, 1, 0), (1, 1, 1), (1, 2, 0), (2, 2, 1), (2, 1, 1)):
        calls.clear()
        metrics.empty_unused_memory(gpu, level, where)
        metrics.empty_unused_memory(cpu, level, where)
        assert len(calls) == called, (level, where)
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--empty-unused-memory-level": 2}))
    assert run.train.empty_unused_memory_level == 2


def test_seed_sets_python_numpy_and_torch_generators():
    """As Megatron-LM: --seed seeds random, numpy and torch (numpy's was left to the OS, so two identical runs
    saved different RNG states)."""
    import random

    import numpy as np
    from megatron_zaya.training.setup import seed_everything

    draws = []
    for _ in range(2):
        seed_everything(1234)
        draws.append((random.random(), np.random.rand(), torch.rand(1).item()))
    assert draws[0] == draws[1]
    seed_everything(1235)
    assert np.random.rand() != draws[0][1]
