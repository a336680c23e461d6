"""Tests of the Triton kernels on CPU tensors through the Triton interpreter.

The interpreter has to be on (TRITON_INTERPRET=1) before `triton` is first imported in the
process: @triton.jit picks interpreter or compiler when a function is defined, and that includes
triton's own standard library (tl.sum, tl.max, ...), which is defined when triton is imported.
Setting the variable from a conftest would be too late when anything imported triton earlier in
the pytest process, and would leak into every test collected after it. So the files here are only
collected when the variable is already set in the environment:

    TRITON_INTERPRET=1 python -m pytest -q tests/kernels/interp

and `tests/kernels/test_kernels_interpreter.py` runs exactly that in a subprocess during a plain
`python -m pytest tests` run, so the rest of the suite never sees the variable.
"""
from __future__ import annotations

import os

import pytest

INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"
collect_ignore_glob = [] if INTERPRETING else ["test_*.py"]


@pytest.fixture
def triton_backend():
    """Force the Triton path in megatron_zaya.kernels for one test (CPU tensors, interpreted)."""
    import megatron_zaya.kernels as K

    previous = K.kernel_backend()
    K.set_kernel_backend("triton")
    yield K
    K.set_kernel_backend(previous)
