"""Rotary position embedding tables (NeoX rotate-half style, partial: the first rotary_dim channels)."""
from __future__ import annotations

import torch


def rope_inverse_frequencies(rotary_dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))


def rope_cos_sin(position_ids: torch.Tensor, rotary_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (B, S, rotary_dim) in fp32 for integer positions (B, S)."""
    inv_freq = rope_inverse_frequencies(rotary_dim, base).to(position_ids.device)
    angles = position_ids.float().unsqueeze(-1) * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()
