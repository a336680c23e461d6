"""Runs the interpreter tests (tests/kernels/interp) in a subprocess with TRITON_INTERPRET=1.

See tests/kernels/interp/conftest.py for why they need their own process. When this pytest
process already has TRITON_INTERPRET=1, the interp tests are collected directly and this wrapper
skips itself."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") == "1", reason="interp tests collected in-process")
def test_triton_kernels_interpreted_on_cpu():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", MEGATRON_ZAYA_KERNELS="auto")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels/interp"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    output = proc.stdout + proc.stderr
    print(output[-4000:])
    assert proc.returncode == 0, output[-12000:]
    assert " passed" in output and "failed" not in output
