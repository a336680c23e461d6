"""Dropless top-1 SwiGLU experts computed grouped: tokens sorted by expert, all experts' matmuls
done as one grouped GEMM each for gate/up and down (torch._grouped_mm), never a loop on the main path.

Weights are stored like the transformers reference: gate_up (E, 2F, D) and down (E, D, F)."""
from __future__ import annotations

import torch
from torch import nn

from megatron_zaya import kernels

_HAS_GROUPED_MM = hasattr(torch, "_grouped_mm")
_GROUPED_MM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _contiguous_grad(t: torch.Tensor) -> torch.Tensor:
    # _grouped_mm's backward rejects expanded (stride-0) gradients, e.g. from .sum().
    if t.requires_grad:
        t.register_hook(lambda g: g.contiguous())
    return t


def grouped_matmul(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Rows of x (sorted by group) times weight[g].T for their group g.

    x: (K, in); weight: (G, out, in); counts: (G,) rows per group, summing to K. Returns (K, out)."""
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
        x, weight = x.to(dtype), weight.to(dtype)
    else:
        weight = weight.to(x.dtype)
    if _HAS_GROUPED_MM and x.dtype in _GROUPED_MM_DTYPES and x.shape[0] > 0:
        offsets = torch.cumsum(counts, 0).to(torch.int32)
        return _contiguous_grad(torch._grouped_mm(x, weight.transpose(-2, -1), offs=offsets))
    # Fallback for builds without grouped GEMM (or float64 checks): correct, slower.
    outputs = [chunk @ w.T for chunk, w in zip(torch.split(x, counts.tolist()), weight)]
    return torch.cat(outputs) if outputs else x.new_zeros(0, weight.shape[1])


class GroupedExperts(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, ffn_hidden_size: int):
        super().__init__()
        self.num_experts = num_experts
        self.gate_up_weight = nn.Parameter(torch.empty(num_experts, 2 * ffn_hidden_size, hidden_size))
        self.down_weight = nn.Parameter(torch.empty(num_experts, hidden_size, ffn_hidden_size))

    def forward(self, tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """tokens (K, D) sorted by expert with counts (E,) -> expert outputs (K, D), same order."""
        hidden = kernels.swiglu(grouped_matmul(tokens, self.gate_up_weight, counts))
        return grouped_matmul(hidden, self.down_weight, counts)
