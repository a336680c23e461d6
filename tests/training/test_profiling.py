"""--profile (megatron_zaya/training/profiling.py): the window of iterations, the files, the flag checks."""
import json

import pytest
import torch

from megatron_zaya.arguments import parse_args
from megatron_zaya.training.config import TrainConfig
from megatron_zaya.training.profiling import StepProfiler
from megatron_zaya.training.setup import build_and_train
from tests.training.helpers import tiny_run_flags


def trace_names(path) -> set[str]:
    with open(path) as f:
        return {event.get("name") for event in json.load(f)["traceEvents"]}


def test_pytorch_profiler_traces_exactly_the_window(tiny_corpus, tmp_path, capsys):
    tb = tmp_path / "tb"
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{
        "--train-iters": 3, "--eval-iters": 0, "--tensorboard-dir": tb, "--profile": "",
        "--use-pytorch-profiler": "", "--profile-step-start": 1, "--profile-step-end": 2,
        "--pytorch-profiler-collect-shapes": ""}))
    assert build_and_train(run) == 0
    assert "profiled iterations 2-2 on rank 0 (torch.profiler)" in capsys.readouterr().out
    written = sorted(p.name for p in tb.iterdir() if not p.name.startswith("events.") and p.name != "vs_samples")
    assert written == ["rank0_iterations2-2.ops.txt", "rank0_iterations2-2.pt.trace.json"]
    names = trace_names(tb / "rank0_iterations2-2.pt.trace.json")
    assert "iteration 2" in names and not {"iteration 1", "iteration 3"} & names
    assert {"aten::mm", "aten::convolution_backward"} <= names     # forward and backward of the step
    table = (tb / "rank0_iterations2-2.ops.txt").read_text()
    assert "aten::mm" in table and "by input shape" in table


def fake_config(**flags) -> TrainConfig:
    cfg = TrainConfig(profile=True, use_pytorch_profiler=True, profile_step_start=1, profile_step_end=4)
    for name, value in flags.items():
        setattr(cfg, name, value)
    return cfg


def run_steps(profiler: StepProfiler, start: int, stop: int) -> None:
    for completed in range(start, stop):
        profiler.before_step(completed)
        torch.ones(8, 8) @ torch.ones(8, 8)
        profiler.after_step(completed + 1)
    profiler.close(stop)


def test_a_window_cut_short_by_the_end_of_training_or_a_resume_writes_what_ran(tmp_path):
    lines = []
    # a resumed run that starts inside the window [1, 4) and ends before its end
    run_steps(StepProfiler(fake_config(tensorboard_dir=str(tmp_path)), 0, 1, lines.append), 2, 3)
    assert lines == [f"profiled iterations 3-3 on rank 0 (torch.profiler): {tmp_path}/rank0_iterations3-3"
                     f".pt.trace.json, {tmp_path}/rank0_iterations3-3.ops.txt"]
    assert trace_names(tmp_path / "rank0_iterations3-3.pt.trace.json") >= {"iteration 3", "aten::mm"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0_iterations3-3.ops.txt",
                                                          "rank0_iterations3-3.pt.trace.json"]   # no temporaries


def test_ranks_outside_profile_ranks_and_runs_past_the_window_profile_nothing(tmp_path):
    lines = []
    run_steps(StepProfiler(fake_config(tensorboard_dir=str(tmp_path), profile_ranks=[0]), 1, 2, lines.append), 0, 6)
    run_steps(StepProfiler(fake_config(tensorboard_dir=str(tmp_path)), 0, 1, lines.append), 5, 8)
    run_steps(StepProfiler(fake_config(tensorboard_dir=str(tmp_path), profile=False), 0, 1, lines.append), 0, 6)
    assert lines == [] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flags, message", [
    ({"--profile-step-start": 5, "--profile-step-end": 5},
     "--profile-step-end=5 must be greater than --profile-step-start=5"),
    ({"--profile-ranks": "3"}, "--profile-ranks 3: not a rank of this run (ranks 0..0)"),
    ({"--tensorboard-dir": None}, "--use-pytorch-profiler writes its traces into --tensorboard-dir"),
    ({"--use-pytorch-profiler": None}, "--profile without --use-pytorch-profiler drives nsys / rocprof"),
    ({"--record-memory-history": ""}, "--record-memory-history records the GPU caching allocator"),
])
def test_profile_flag_errors_name_the_flag(tiny_corpus, tmp_path, capsys, flags, message):
    if torch.cuda.is_available():
        pytest.skip("the GPU-only checks are about CPU runs")
    given = {"--profile": "", "--use-pytorch-profiler": "", "--tensorboard-dir": tmp_path / "tb"}
    given.update(flags)
    with pytest.raises(SystemExit):
        parse_args(tiny_run_flags(tiny_corpus, tmp_path, **given))
    assert message in capsys.readouterr().err


def test_use_pytorch_profiler_alone_warns(tiny_corpus, tmp_path):
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--use-pytorch-profiler": ""}))
    assert "--use-pytorch-profiler without --profile: nothing is profiled" in run.warnings


def test_the_profiler_api_window_on_rocm_says_rocprof_records_the_whole_run(tmp_path, monkeypatch):
    """PyTorch's ROCm build makes cudaProfilerStart/Stop succeed doing nothing: --profile without
    --use-pytorch-profiler says so (on CUDA it does not)."""
    import contextlib
    calls = []
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append("stop"))
    monkeypatch.setattr(torch.autograd.profiler, "emit_nvtx", lambda **kw: contextlib.nullcontext())
    for hip, warned in (("6.4.0", True), (None, False)):
        monkeypatch.setattr(torch.version, "hip", hip)
        lines = []
        run_steps(StepProfiler(fake_config(tensorboard_dir=str(tmp_path), use_pytorch_profiler=False), 0, 1,
                               lines.append), 0, 6)
        assert calls[-2:] == ["start", "stop"]
        assert any("WARNING: --profile on ROCm: the profiler API does not start or stop rocprof" in line
                   and "iteration 2" in line for line in lines) == warned, lines
        assert lines[-1] == "profiled iterations 2-4 on rank 0 (CUDA profiler API, for nsys / rocprof)"
