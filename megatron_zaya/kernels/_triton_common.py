"""Shared helpers for the Triton kernel modules (imported only when triton is importable)."""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from megatron_zaya.kernels.capability import triton_interpreted

# Read once, when a kernel module is imported: that is also when @triton.jit decides between the
# compiler and the interpreter, so the two always agree.
INTERPRET = triton_interpreted()
_DOT_IN_FP32 = tl.constexpr(INTERPRET)


@triton.jit
def dot_operand(x, like_ptr):
    """x cast to the element type of like_ptr, for tl.dot; fp32 when interpreting: the interpreter's
    tl.dot returns garbage for bf16 operands (triton 3.x on CPU: errors of ~1e10 on a 16 x 16 product)."""
    if _DOT_IN_FP32:
        return x.to(tl.float32)
    else:
        return x.to(like_ptr.dtype.element_ty)


@triton.jit
def dot_acc(a, b, acc, like_ptr):
    """acc + a @ b with operands cast by dot_operand. fp32 tensors (like_ptr's element type) are
    multiplied in full fp32 ("ieee"), as torch does with TF32 off (its default); Triton's default
    rounds fp32 operands to TF32 (10-bit mantissa), which on a GPU made the fp32 model check differ
    from torch by 1e-3 and flip near-tie routings. bf16 operands use the tensor cores as before."""
    if _DOT_IN_FP32:  # the interpreter multiplies in numpy fp32 (and cannot resolve input_precision)
        return tl.dot(dot_operand(a, like_ptr), dot_operand(b, like_ptr), acc)
    elif like_ptr.dtype.element_ty == tl.float32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(dot_operand(a, like_ptr), dot_operand(b, like_ptr), acc)


def configs(gpu_configs: list, interpret_config):
    """Autotune configs: the full list on a GPU, a single one when interpreting (each launched
    program costs about a millisecond in the interpreter, so tuning there is pointless)."""
    return [interpret_config] if INTERPRET else list(gpu_configs)


def deterministic_prune(configs_: list, named_args: dict, **kwargs) -> list:
    """The autotuner's config pruning: under `torch.use_deterministic_algorithms` (--deterministic-mode) the list's
    last config alone, a fixed choice that launches everywhere the kernels run (Newton-Schulz's fits MI300X in
    fp32 too). Autotuning keeps whichever config timed fastest in this process, and the block sizes set the order
    of a kernel's sums, so two runs of the same seed (or a restart on another node) differed in the last bits."""
    return configs_[-1:] if torch.are_deterministic_algorithms_enabled() else configs_


PRUNE = {"early_config_prune": deterministic_prune}


def num_warps_configs(**meta):
    """Configs that only vary num_warps (row kernels whose block size is fixed by the row length)."""
    return configs(
        [triton.Config(dict(meta), num_warps=w) for w in (4, 8, 16)],
        triton.Config(dict(meta), num_warps=1),
    )


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def num_programs_hint(device: torch.device) -> int:
    """How many persistent programs a reduction kernel should launch."""
    if INTERPRET or device.type != "cuda":
        return 4
    return _multi_processor_count(device.index if device.index is not None else torch.cuda.current_device()) * 4


@functools.lru_cache(maxsize=None)
def _multi_processor_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def rows_2d(x: torch.Tensor) -> torch.Tensor:
    """View x as (rows, last_dim) with a unit stride on the last dim (copying only if needed)."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[-1] > 1 and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2
