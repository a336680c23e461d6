"""The Triton kernels lower through the real compiler for NVIDIA sm_90 (cubin) and AMD gfx942
(hsaco) on a machine without a GPU, with the argument types and constexprs the wrappers launch
them with (megatron_zaya.kernels.compile_check). The cheap row kernels are compiled here; the
matmul kernels (Newton-Schulz, CCA conv) take seconds each and are checked by running
`python -m megatron_zaya.kernels.compile_check` by hand (see docs/KERNELS.md)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def compile_check(*args: str) -> tuple[int, str]:
    """`python -m megatron_zaya.kernels.compile_check ARGS` without the interpreter: (exit code, output)."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_DEFAULT_FP_FUSION="1")
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-m", "megatron_zaya.kernels.compile_check", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=900)
    return proc.returncode, proc.stdout + proc.stderr


def test_row_kernels_compile_for_cuda_and_rocm():
    code, out = compile_check("--targets", "cuda:90,hip:gfx942",
                              "--only", "rmsnorm,swiglu,rope,cross_entropy,moe_permute")
    assert code == 0, out[-6000:]
    assert "- PASS" in out
    for name in ["_fwd_kernel", "_bwd_kernel", "_rope_kernel", "_partials_kernel", "_grad_kernel", "_gather_rows",
                 "_unpermute_bwd"]:
        assert name in out, name
    assert "cubin" in out and "hsaco" in out


def test_newton_schulz_has_a_config_that_fits_mi300x_in_bf16_and_fp32():
    """Every autotune config is compiled for gfx942 and its shared memory compared with MI300X's 64 KiB: an fp32
    Newton-Schulz (Muon(ns_dtype=torch.float32)) had none that fits, so it could not launch there."""
    code, out = compile_check("--targets", "hip:gfx942", "--only", "newton_schulz", "--all-configs")
    assert code == 0 and "- PASS" in out and "no config that fits" not in out, out[-6000:]
    assert "smem" in out and "EXCEEDS" in out       # the big configs do not fit: the check sees it


def test_newton_schulz_multiplies_fp32_in_full_fp32_on_nvidia():
    """Muon(ns_dtype=torch.float32): both Newton-Schulz matmul kernels, compiled for sm_90 with fp32 operands,
    hold no TF32 product in their PTX (compile_check fails on one; Triton's tl.dot rounded fp32 to TF32 where
    the reference's bmm does not)."""
    code, out = compile_check("--targets", "cuda:90", "--only", "newton_schulz")
    assert code == 0 and "- PASS" in out and "TF32" not in out, out[-6000:]
    assert "_syrk" in out and "_gemm_axpby" in out
