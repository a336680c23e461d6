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


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU run is the interpreter check")
def test_accuracy_verdict_flags_a_kernel_less_accurate_than_eager():
    """bench/kernels.py's GPU verdict (errors against a float64 reference, Triton's at most 2x
    eager's or the dtype's floor): a kernel that rounds its fp32 output through bf16 fails it, the
    eager function itself passes it."""
    pytest.importorskip("triton")
    code = """
import torch, bench.kernels as B
x = torch.randn(64, 32, requires_grad=True)
exact = lambda a: a * 3.0
coarse = lambda a: (a * 3.0).to(torch.bfloat16).float()
good = B.accuracy(B.Case("exact", exact, exact, [x], grads=[torch.randn(64, 32)]))
bad = B.accuracy(B.Case("coarse", coarse, exact, [x], grads=[torch.randn(64, 32)]))
assert all(r["ok"] for r in good), good
assert not bad[0]["ok"] and bad[0]["triton_error"] > 1e-3 and bad[0]["eager_error"] < 1e-6, bad
print("verdict ok")
"""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "verdict ok" in proc.stdout, proc.stdout + proc.stderr
