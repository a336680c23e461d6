"""The ZAYA1 router: down-projection, exponential depth averaging (EDA), 3-layer MLP, top-1 with
detached balancing biases and a skip class. Computed in fp32 (spec/zaya1.md section 3)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from megatron_zaya.config import ModelConfig
from megatron_zaya.kernels.reference_moe import class_counts
from megatron_zaya.model import recompute
from megatron_zaya.model.norm import RMSNorm, at_least_fp32


@dataclass
class Routing:
    expert_index: torch.Tensor   # (N,) int64 in [0, E]; E is the skip class
    gate: torch.Tensor           # (N,) fp32 unbiased probability of the chosen class (0 for skip)
    counts: torch.Tensor         # (E + 1,) int64 tokens per class in this batch (for balancing + logging)
    probs: torch.Tensor          # (N, E + 1) fp32 router probabilities (for logging: entropy)


class ZayaRouter(nn.Module):
    recompute_module = "moe_act"
    recompute_selective = False     # memory policy (ZayaModel.set_recompute): the GELU outputs recomputed
    force_balanced = False          # benchmarks only (ZayaModel.set_force_load_balancing): token i -> i mod E

    def __init__(self, config: ModelConfig, use_eda: bool):
        super().__init__()
        r, classes = config.router_hidden_size, config.num_router_classes
        self.num_experts = config.num_experts
        self.down_proj = nn.Linear(config.hidden_size, r, bias=True)
        self.eda_gamma = nn.Parameter(torch.ones(r)) if use_eda else None
        self.norm = RMSNorm(r, config.norm_epsilon)
        self.fc1 = nn.Linear(r, r, bias=True)
        self.fc2 = nn.Linear(r, r, bias=True)
        self.out_proj = nn.Linear(r, classes, bias=False)
        # Balancing biases: only choose the expert, never enter the gate or receive gradients.
        bias = torch.zeros(classes, dtype=torch.float32)
        bias[-1] = config.skip_class_bias_init
        self.register_buffer("balancing_bias", bias)

    def forward(self, x: torch.Tensor, previous_state: torch.Tensor | None):
        """x (B, S, D) normed hidden -> (Routing over B*S tokens, router state for the next MoE layer)."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            state = self.down_proj(at_least_fp32(x))
            if self.eda_gamma is not None and previous_state is not None:
                state = state + previous_state * self.eda_gamma
            # out_proj(gelu(fc2(gelu(fc1(norm(state)))))); under selective recomputation the GELU outputs,
            # which fc2 and out_proj keep for their backward, are recomputed from the GELU inputs instead.
            drop = recompute.selective(self)
            hidden = recompute.feed(self.fc2, F.gelu, self.fc1(self.norm(state)), drop)
            logits = recompute.feed(self.out_proj, F.gelu, hidden, drop)
            probs = torch.softmax(at_least_fp32(logits), dim=-1).reshape(-1, logits.shape[-1])
            if self.force_balanced:     # the same share for every expert, none skipped; deterministic (recompute)
                expert_index = torch.arange(probs.shape[0], device=probs.device) % self.num_experts
            else:
                expert_index = torch.argmax(probs.detach() + self.balancing_bias, dim=-1)
            gate = probs.gather(1, expert_index.unsqueeze(1)).squeeze(1)
            gate = gate.masked_fill(expert_index == self.num_experts, 0.0)
        counts = class_counts(expert_index, self.num_experts + 1)
        return Routing(expert_index, gate, counts, probs), state
