"""Fused ops with one switch: Triton kernels on a GPU, the PyTorch reference elsewhere.

The model and optimizers call the functions exported here; `reference.py` holds the math.
"""
from megatron_zaya.kernels.reference import (  # noqa: F401
    apply_partial_rope,
    cross_entropy,
    moe_permute,
    moe_unpermute,
    newton_schulz,
    rms_norm,
    scaled_residual_add,
    scaled_residual_add_rms_norm,
    swiglu,
)
