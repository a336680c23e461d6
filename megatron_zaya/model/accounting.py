"""Parameter, FLOP and KV-cache accounting for a ModelConfig (used by model_stats, MFU and the planner).

Parameters are counted on a model built on the meta device, so the numbers are the real module's.

FLOPs per token (forward; training = 3x forward: backward costs two matmuls per forward matmul):
  2 x multiply-accumulates of every matmul a token passes through, with ONLY ONE expert active:
    attention projections  D*(HQ*dh) + D*(HKV*dh) + 2*D*(HKV*dh/2) + (HQ*dh)*D
    CCA convolutions       C*k_depthwise + C*dh*k_grouped          (C = (HQ+HKV)*dh)
    router                 D*R + 2*R*R + R*(E+1)
    one expert (SwiGLU)    3*D*F
    LM head                D*V                                     (once, not per layer)
  plus causal attention: QK^T and AV each 2*HQ*dh MACs per key, and a token at position t sees t+1
  keys, so on average (S+1)/2 keys over a sequence of S.
Norms, residual scaling, softmax and activations are elementwise and left out (< 1% here).
A token routed to the skip class does no expert work; the count assumes every token uses one expert,
an upper bound that matches the "active parameters" convention.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from megatron_zaya.config import ModelConfig


@dataclass
class ParameterCounts:
    total: int                  # every parameter, embedding included (tied head counted once)
    embedding: int              # word embedding (+ untied output layer)
    expert: int                 # all experts of all layers
    one_expert: int             # one expert's weights (one layer)

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding

    def active_non_embedding(self, num_experts: int) -> int:
        """Non-embedding parameters a token uses: one expert of each layer instead of all."""
        return self.non_embedding - self.expert + self.expert // num_experts


def count_parameters(config: ModelConfig) -> ParameterCounts:
    from megatron_zaya.model import ZayaModel

    with torch.device("meta"):
        model = ZayaModel(config)
    total = sum(p.numel() for p in model.parameters())
    embedding = model.embedding.weight.numel()
    if model.output_layer is not None:
        embedding += model.output_layer.weight.numel()
    expert = sum(p.numel() for block in model.layers for p in block.moe.experts.parameters())
    one_expert = expert // (config.num_layers * config.num_experts)
    return ParameterCounts(total, embedding, expert, one_expert)


def matmul_macs_per_token(config: ModelConfig) -> dict[str, int]:
    d, dh, hq, hkv = config.hidden_size, config.kv_channels, config.num_attention_heads, config.num_query_groups
    r, e, f, layers = config.router_hidden_size, config.num_experts, config.moe_ffn_hidden_size, config.num_layers
    channels = (hq + hkv) * dh
    per_layer = {
        "attention_projections": d * hq * dh + d * hkv * dh + 2 * d * (hkv * dh // 2) + hq * dh * d,
        "cca_convolutions": channels * config.cca_depthwise_kernel + channels * dh * config.cca_grouped_kernel,
        "router": d * r + 2 * r * r + r * (e + 1),
        "active_expert": 3 * d * f,
    }
    macs = {name: value * layers for name, value in per_layer.items()}
    macs["lm_head"] = d * config.vocab_size
    return macs


def attention_macs_per_token(config: ModelConfig, seq_length: int) -> float:
    average_keys = (seq_length + 1) / 2
    return config.num_layers * 2 * config.num_attention_heads * config.kv_channels * average_keys


def forward_flops_per_token(config: ModelConfig, seq_length: int | None = None) -> float:
    seq_length = seq_length or config.seq_length
    return 2 * (sum(matmul_macs_per_token(config).values()) + attention_macs_per_token(config, seq_length))


def training_flops_per_token(config: ModelConfig, seq_length: int | None = None) -> float:
    return 3 * forward_flops_per_token(config, seq_length)


def kv_cache_bytes_per_token(config: ModelConfig, bytes_per_value: int = 2) -> int:
    """K and V after norm and RoPE: 2 x HKV x dh values per token per layer."""
    return config.num_layers * 2 * config.num_query_groups * config.kv_channels * bytes_per_value


def decode_state_bytes_per_sequence(config: ModelConfig, bytes_per_value: int = 2) -> int:
    """Constant-size decode state: the conv context of pre-conv q0/k0 and the delayed value."""
    channels = (config.num_attention_heads + config.num_query_groups) * config.kv_channels
    context = config.cca_depthwise_kernel - 1 + config.cca_grouped_kernel - 1
    per_layer = channels * context + config.num_query_groups * config.kv_channels // 2
    return config.num_layers * per_layer * bytes_per_value
