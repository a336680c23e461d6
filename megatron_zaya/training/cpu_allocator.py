"""Keep freed CPU memory inside the process (glibc malloc), so a training step does not fault its
tensors' pages in again every iteration.

PyTorch's CPU tensors come straight from malloc. glibc serves large blocks with mmap and unmaps them
when they are freed (the threshold starts at 128 KiB and adapts up to 32 MiB), and it gives the top of
the heap back to the kernel once more than twice that threshold is free there. A training step
allocates and frees the same large tensors every iteration (activations, the logits, per-block
softmax buffers), so their pages are first-touch faulted again each time; on a virtual machine a
fault costs microseconds. Measured on the 2-core CI machine (a micro-benchmark, 2026-12-03):
`x.float()` of a 2048 x 8192 bf16 tensor 1.74 ns per element with glibc's defaults, 0.36 with the heap
kept.

`keep_freed_memory()` sets M_MMAP_MAX = 0 (every block from the heap; glibc still falls back to mmap
when the heap cannot grow) and M_TRIM_THRESHOLD to its maximum (never give the top back). The
process's resident memory then stays at its peak instead of shrinking between steps: what a training
process holds anyway. Applied by the training setup on CPU (training/setup.build_runtime, so also by
bench/train_throughput.py) and by bench/model_throughput.py (to both models it compares). Set
MEGATRON_ZAYA_KEEP_FREED_MEMORY=0 to leave glibc's defaults. Not glibc (macOS, musl): nothing to do,
returns False.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1      # glibc <malloc.h>
M_MMAP_MAX = -4
_INT_MAX = 2 ** 31 - 1

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Configure glibc malloc as above, once per process; True when it is in effect."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get("MEGATRON_ZAYA_KEEP_FREED_MEMORY", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    _applied = mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, _INT_MAX) == 1
    return _applied
