"""bench/kernels.py on a machine without a GPU runs the Triton interpreter check of every kernel
(forward and backward against reference.py) and exits non-zero on any mismatch."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the bench times kernels instead")
def test_bench_interpreter_check_passes():
    pytest.importorskip("triton")
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # the script sets it itself before importing triton
    proc = subprocess.run([sys.executable, "bench/kernels.py"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "interpreter check: PASS" in out
    for name in ["rms_norm", "residual+rms_norm", "swiglu", "rope", "cross_entropy", "linear_cross_entropy",
                 "moe permute", "newton_schulz", "cca conv"]:
        assert name in out, name


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU run the real benchmark")
def test_bench_timing_report_path_runs_on_cpu(tmp_path):
    """The GPU reporting path (timing, bandwidth, JSON) exercised on CPU through the interpreter."""
    pytest.importorskip("triton")
    import json

    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    out_json = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "bench/kernels.py", "--time-on-cpu", "--reps", "1", "--only", "swiglu fwd,rope in-place",
                           "--json", str(out_json)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out_json.read_text())
    names = [r["kernel"] for r in data["results"]]
    assert names == ["swiglu fwd", "swiglu fwd+bwd", "rope in-place fwd"]
    for r in data["results"]:
        assert r["check"] is True and r["triton_ms"] > 0 and r["eager_ms"] > 0 and r["copy_gbps"] > 0
