"""The MoE sublayer: router -> permute by expert -> grouped experts -> gate-weighted unpermute.

A token routed to the skip class costs no expert compute and contributes zeros, as the transformers
reference does (Zyphra's original code returned s_skip * x instead)."""
from __future__ import annotations

import torch
from torch import nn

from megatron_zaya import kernels
from megatron_zaya.config import ModelConfig
from megatron_zaya.model.experts import GroupedExperts
from megatron_zaya.model.router import Routing, ZayaRouter


class MoELayer(nn.Module):
    # Memory policy (ZayaModel.set_recompute, --recompute-modules moe): the block runs the whole sublayer
    # again in the backward (ZayaBlock.run_moe).
    recompute_module = "moe"
    recompute_selective = False

    def __init__(self, config: ModelConfig, use_eda: bool):
        super().__init__()
        self.num_experts = config.num_experts
        self.router = ZayaRouter(config, use_eda)
        self.experts = GroupedExperts(config.num_experts, config.hidden_size, config.moe_ffn_hidden_size)

    def forward(self, x: torch.Tensor, router_state: torch.Tensor | None):
        b, s, d = x.shape
        routing, router_state = self.router(x, router_state)
        out = self.dispatch_and_combine(x.reshape(b * s, d), routing)
        return out.view(b, s, d), router_state, routing

    def dispatch_and_combine(self, tokens: torch.Tensor, routing: Routing) -> torch.Tensor:
        """Single-device dispatch; expert parallelism replaces this method with an all-to-all one."""
        permuted, order, counts = kernels.moe_permute(tokens, routing.expert_index, self.num_experts)
        expert_out = self.experts(permuted, counts)
        return kernels.moe_unpermute(expert_out, order, routing.gate, tokens.shape[0])
