"""Monitoring details: the MFU peak table, the progress bar, --exit-duration-in-mins."""
import re
import time

import pytest
import torch

from megatron_zaya.arguments import parse_args
from megatron_zaya.training import metrics
from megatron_zaya.training.setup import build_and_train
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


def test_progress_bar_line(tiny_corpus, tmp_path, capsys):
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": 3, "--eval-iters": 0,
                                                               "--progress-bar": ""}))
    assert build_and_train(run) == 0
    captured = capsys.readouterr()
    assert re.search(r"train: 100%\|.*\| 3/3 \[.*loss=\d+\.\d{3}\]", captured.err), captured.err[-500:]
    assert "iteration       3/3" in captured.out + captured.err      # console lines go through the bar


def test_with_ramp_up_the_progress_bar_counts_samples(tiny_corpus, tmp_path, capsys):
    """Ramp-up iterations grow (2, 2, 4, 4, ... samples): the bar counts samples, so its rate and ETA hold."""
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
    assert "iteration       1/6" in out and "iteration       2/6" not in out
    assert "skipping the final evaluation (--exit-duration-in-mins 0.02 reached)" in out
    assert "validation" not in out and "test loss" not in out
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == "1"


def test_interval_meter_averages_and_durations():
    m = metrics.IntervalMeter()
    m.add(2.0, 0.5, 100, skipped=False)
    m.add(float("nan"), 1.5, 100, skipped=True)      # a skipped step: time and tokens count, its loss does not
    m.add(4.0, 1.0, 100, skipped=False)
    assert (m.mean_loss, m.seconds_per_iteration, m.tokens_per_second(), m.skipped) == (3.0, 1.0, 100.0, 1)
    assert [metrics.format_duration(s) for s in (5, 75, 12345)] == ["5s", "1m15s", "3h25m45s"]


def test_straggler_report_names_the_ends_and_the_ratio():
    from megatron_zaya.training.stragglers import StragglerReport
    report = StragglerReport([0.5, 2.0, 0.4, 1.0], count=2)
    assert report.line() == ("stragglers (forward+backward per iteration): slowest ranks 1 2.000 s, 3 1.000 s | "
                             "fastest ranks 2 0.400 s, 0 0.500 s | slowest/fastest 5.00x")
    assert report.scalars() == {"straggler/max-seconds": 2.0, "straggler/min-seconds": 0.4, "straggler/ratio": 5.0}


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


def test_log_progress_without_save_warns(tiny_corpus, tmp_path):
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--log-progress": ""}))
    assert "--log-progress without --save: nothing is written (progress.txt goes into the --save folder)" in run.warnings


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
