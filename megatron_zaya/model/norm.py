"""RMSNorm and ZAYA1's learned residual scaling."""
from __future__ import annotations

import torch
from torch import nn

from megatron_zaya import kernels


class RMSNorm(nn.Module):
    """Keeps only its input and the per-row rstd for the backward (both kernel paths), so
    --recompute-modules layernorm has nothing to recompute here."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.rms_norm(x, self.weight, self.eps)


class ResidualScaling(nn.Module):
    """merged = (out + out_bias) * out_scale + (residual + res_bias) * res_scale (per-channel pairs).

    Used on every residual merge; the merged stream keeps the residual's dtype (fp32)."""

    def __init__(self, dim: int):
        super().__init__()
        self.out_scale = nn.Parameter(torch.ones(dim))
        self.out_bias = nn.Parameter(torch.zeros(dim))
        self.res_scale = nn.Parameter(torch.ones(dim))
        self.res_bias = nn.Parameter(torch.zeros(dim))

    def forward(self, out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return kernels.scaled_residual_add(out, residual, self.out_scale, self.out_bias, self.res_scale, self.res_bias)

    def forward_and_norm(self, out: torch.Tensor, residual: torch.Tensor, norm: RMSNorm):
        """The merge fused with the RMSNorm that follows it: returns (new residual, normed)."""
        return kernels.scaled_residual_add_rms_norm(out, residual, self.out_scale, self.out_bias, self.res_scale,
                                                    self.res_bias, norm.weight, norm.eps)


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """x in fp32, or left in fp64: the upcast of the residual stream and the router, which must not
    round a float64 model (the whole-model check's reference) down to fp32."""
    return x if x.dtype == torch.float64 else x.float()


class InputScaling(nn.Module):
    """(x + bias) * scale on the embedding output, before the fp32 residual stream begins."""

    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return at_least_fp32((x + self.bias) * self.scale)
