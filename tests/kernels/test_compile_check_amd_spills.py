"""compile_check reports registers and spill bytes per thread for AMD targets as it does for CUDA ones, from the
AMDGPU metadata of the compiled kernel (it printed none for HIP, so a config that spilled kilobytes per thread on
gfx942 passed unseen). One small kernel is compiled for gfx942 with a register budget it cannot fit in and once
at a size that needs a handful of registers (about 2 s for both together)."""
import os
import re

import pytest

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
                                reason="@triton.jit kernels are interpreter functions in this process")


def _amd_backend():
    triton = pytest.importorskip("triton")
    from triton.backends import backends

    if "amd" not in backends:
        pytest.skip(f"triton {triton.__version__} has no AMD backend")


def test_amd_spills_are_reported_like_cuda_ones(monkeypatch, capsys):
    _amd_backend()
    import torch
    import triton
    import triton.language as tl

    from megatron_zaya.kernels import compile_check

    @triton.jit
    def normalise(x_ptr, out_ptr, N: tl.constexpr):
        """x / sum(x): every element of the block is live across the reduction."""
        i = tl.arange(0, N)
        x = tl.load(x_ptr + i)
        tl.store(out_ptr + i, x / tl.sum(x, 0))

    # 16 wavefronts of 64 lanes leave each lane 128 of gfx942's 512 registers: 128 values per lane cannot fit
    # next to the addresses and the reduction; 1 value per lane needs a handful.
    x = torch.empty(64 * 16 * 128)
    records = [(normalise, (x, x), {}, [triton.Config({"N": 64 * 16 * 128}, num_warps=16),
                                        triton.Config({"N": 64 * 16}, num_warps=16)])]
    monkeypatch.setattr(compile_check, "_record_launches", lambda: records)
    monkeypatch.setattr(compile_check, "_drive_wrappers", lambda: None)
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    assert compile_check.main(["--targets", "hip:gfx942", "--all-configs"]) == 0      # a spill is slow, not wrong
    out = capsys.readouterr().out
    label = "test_compile_check_amd_spills.normalise"
    big, small = [line for line in out.splitlines() if line.startswith(label + " ")]
    assert "hip:gfx942" in big and f"N={64 * 16 * 128} " in big and f"N={64 * 16} " in small, out
    spill = re.search(r"regs (\d+) spill (\d+)B", big)
    assert spill and int(spill.group(2)) > 0 and int(spill.group(1)) <= 128, out
    assert re.search(r"regs \d+ spill 0B", small), out
    listed = out.split("register spills (slow, not wrong):\n")[1].splitlines()
    assert listed == [f"  {label} gfx942 {spill.group(0)}"], out
    assert "- PASS" in out


def test_amdgcn_usage_reads_the_metadata():
    from megatron_zaya.kernels.compile_check import amdgcn_usage

    meta = "  .name: k\n    .private_segment_fixed_size: 760\n    .sgpr_spill_count: 3\n    .vgpr_count:     128\n"
    assert amdgcn_usage(meta) == "regs 128 spill 760B"
    assert amdgcn_usage("no metadata") == "regs ? spill ?B"
