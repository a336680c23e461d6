"""One ZAYA1 block: [norm, CCA, scaled residual merge] then [norm, router + experts, scaled merge].

The residual stream is fp32 throughout; sublayers see its RMSNorm."""
from __future__ import annotations

import torch
from torch import nn

from megatron_zaya.config import ModelConfig
from megatron_zaya.model import recompute
from megatron_zaya.model.cca import CompressedConvAttention
from megatron_zaya.model.moe import MoELayer
from megatron_zaya.model.norm import ResidualScaling, RMSNorm


class ZayaBlock(nn.Module):
    def __init__(self, config: ModelConfig, layer_number: int):
        super().__init__()
        self.layer_number = layer_number
        self.input_norm = RMSNorm(config.hidden_size, config.norm_epsilon)
        self.attention = CompressedConvAttention(config)
        self.attention_residual = ResidualScaling(config.hidden_size)
        self.pre_mlp_norm = RMSNorm(config.hidden_size, config.norm_epsilon)
        # EDA needs a previous MoE sublayer: the first block has none.
        self.moe = MoELayer(config, use_eda=layer_number > 0)
        self.mlp_residual = ResidualScaling(config.hidden_size)

    def forward(self, residual: torch.Tensor, router_state, cos, sin, attention_mask=None):
        attn_out = self.attention(self.input_norm(residual), cos, sin, attention_mask)
        residual, normed = self.attention_residual.forward_and_norm(attn_out, residual, self.pre_mlp_norm)
        moe_out, router_state, routing = self.run_moe(normed, router_state)
        residual = self.mlp_residual(moe_out, residual)
        return residual, router_state, routing

    def run_moe(self, normed: torch.Tensor, router_state):
        """The MoE sublayer; under --recompute-modules moe it keeps only its inputs and runs again,
        collectives included, in the backward (model/recompute.py)."""
        if recompute.selective(self.moe):
            return recompute.rerun_in_backward(self.moe, normed, router_state)
        return self.moe(normed, router_state)
