"""What a device's matmuls can do fast: whether bf16 runs natively, and the dtype Muon's
Newton-Schulz should use there.

GPUs (CUDA, ROCm) run bf16 matmuls natively. A CPU does only when oneDNN has a bf16 kernel for it
(AVX-512 with or without AVX512-BF16, AMX, or Arm's BF16 extension); on an AVX2-only CPU PyTorch
falls back to a scalar loop: measured on a 2-core AMD EPYC with AVX2 only (2026-12-03), a 2048^2
bf16 matmul took 97 s (0.18 GFLOP/s) against 0.21 s in fp32 (82 GFLOP/s).
"""
from __future__ import annotations

import functools
import os

import torch


@functools.lru_cache(maxsize=None)
def triton_interpreted() -> bool:
    """Whether TRITON_INTERPRET asks Triton to run its kernels in the interpreter (on CPU)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "no")


def _cpu_bf16_is_native() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):   # a build without this private check: assume native
        return True


def bf16_matmul_is_native(device: torch.device | str) -> bool:
    """True when bf16 matmuls on `device` run on native kernels (any GPU; a CPU oneDNN supports)."""
    device = torch.device(device)
    return device.type != "cpu" or _cpu_bf16_is_native()   # the CPU answer: asked once per process


def newton_schulz_dtype(device: torch.device | str) -> torch.dtype:
    """Muon's default Newton-Schulz dtype: bf16 (as ZAYA1's Muon) where bf16 matmuls are native,
    fp32 otherwise (more accurate, and there 20x to 500x faster)."""
    return torch.bfloat16 if bf16_matmul_is_native(device) else torch.float32


def slow_bf16_warning(device: torch.device | str, flag: str = "--bf16") -> str | None:
    """A one-line warning for `flag` (bf16 compute) on a device without native bf16 matmuls, else None."""
    if bf16_matmul_is_native(device):
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    return (f"{flag}: this CPU ({capability}) has no native bf16 matmul (oneDNN needs AVX-512, AMX or "
            f"Arm BF16), so bf16 matmuls run 20x to 500x slower than fp32 here; drop {flag} on this "
            f"machine (fp32 trains the same model)")
