"""Every autotune config of the CCA conv kernels compiles without register spills for AMD gfx942 (MI300X) and
NVIDIA sm_90 (H100/H200), as compile_check reports them. The 32 x 128 x 32 tile on 8 warps spilled about 1 KB per
thread in the backward kernel on gfx942, where 8 wavefronts leave each lane 256 registers, and the 64 x 64 x 32
tile spilled 64 B per thread in the forward with left context on sm_90. One launch with left context (HAS_LEFT)
is recorded; each test compiles one kernel for one target, once per config."""
import os
import re

import pytest

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
                                reason="@triton.jit kernels are interpreter functions in this process")


def _compile_cca_conv(monkeypatch, capsys, target: str, kernel: str) -> str:
    """compile_check's output for every config of triton_cca_conv.`kernel` as launched with left context."""
    triton = pytest.importorskip("triton")
    from triton.backends import backends
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    backend = target.split(":")[0]
    if {"cuda": "nvidia", "hip": "amd"}[backend] not in backends:
        pytest.skip(f"triton {triton.__version__} has no {backend} backend")
    import torch

    from megatron_zaya.kernels import compile_check, triton_cca_conv

    monkeypatch.setattr(JITFunction, "run", JITFunction.run)       # compile_check replaces the launchers:
    monkeypatch.setattr(Autotuner, "run", Autotuner.run)           # put them back after the test
    records = compile_check._record_launches()

    def leaf(*shape):
        return torch.randn(*shape).to(torch.bfloat16).requires_grad_(True)

    out = triton_cca_conv.cca_causal_conv(leaf(1, 8, 256), leaf(256, 1, 2), leaf(256), leaf(256, 128, 2), leaf(256),
                                          leaf(1, 256, 2))
    out.backward(torch.ones_like(out))
    monkeypatch.setattr(compile_check, "_record_launches", lambda: records)
    monkeypatch.setattr(compile_check, "_drive_wrappers", lambda: None)
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    assert compile_check.main(["--targets", target, "--all-configs", "--only", f"cca_conv.{kernel}"]) == 0
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if line.startswith(f"triton_cca_conv.{kernel} ")]
    assert len(lines) == len(triton_cca_conv._CONFIGS) and all("HAS_LEFT=True" in line for line in lines), printed
    return printed


def test_cca_conv_backward_configs_do_not_spill_on_gfx942(monkeypatch, capsys):
    printed = _compile_cca_conv(monkeypatch, capsys, "hip:gfx942", "_bwd_kernel")
    assert "register spills" not in printed and len(re.findall(r" spill 0B ", printed)) == 3, printed


def test_cca_conv_forward_configs_do_not_spill_on_sm90(monkeypatch, capsys):
    printed = _compile_cca_conv(monkeypatch, capsys, "cuda:90", "_fwd_kernel")
    assert "register spills" not in printed and len(re.findall(r" spill 0B ", printed)) == 3, printed
