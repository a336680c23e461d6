"""Auxiliary-loss-free load balancing of the ZAYA1 router (spec/zaya1.md section 3, step 6).

After every optimizer step, for each MoE layer: p_e = share of the global batch's ROUTED tokens
(the skip class left out) that chose expert e; the error p_e - 1/E is the gradient of that layer's
balancing biases, applied by a small Adam ("PID-like": the first moment integrates the error, the
second scales it). The mean of the expert biases is kept fixed and the skip bias stays at its init.
With the skip bias at -1 against probabilities, that means the skip class is never chosen: the best
expert's p_e + b_e is at least the experts' mean, (1 - p_skip) / E > 0 > p_skip - 1. A run that loads
biases which let it skip keeps that rate.

With a skip target R (--moe-router-skip-target) the skip class is balanced too: p over every token,
the targets (1 - R) / E per expert and R for the skip class, so that about a share R of the tokens skip
the experts' compute. Only the biases' differences choose, so the step is taken relative to the skip
class's: the skip bias stays at its init (transformers' ZAYA sets it to -1 on load) and the expert biases
move against it.
The hyperparameters are not published: these defaults are ours (flags --moe-router-bias-*).
"""
from __future__ import annotations

import torch


class BalancingBiasUpdater:
    def __init__(self, biases: list[torch.Tensor], lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999,
                 eps: float = 1e-8, skip_target: float | None = None):
        self.biases = biases          # the routers' balancing_bias buffers, (E + 1,) each, updated in place
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.skip_target = skip_target
        balanced = biases[0].numel() - (1 if skip_target is None else 0)    # the experts, and the skip class
        self.exp_avg = torch.zeros(len(biases), balanced, dtype=torch.float64)
        self.exp_avg_sq = torch.zeros_like(self.exp_avg)
        self.steps = 0

    @staticmethod
    def load_error(counts: torch.Tensor, skip_target: float | None = None) -> torch.Tensor:
        """counts (L, E + 1) -> p_e - 1/E over routed tokens, (L, E); with a skip target, p over every token
        less the targets, (1 - R) / E per expert and R for the skip class, (L, E + 1)."""
        if skip_target is None:
            routed = counts[:, :-1].double()
            shares = routed / routed.sum(dim=1, keepdim=True).clamp_min(1.0)
            return shares - 1.0 / routed.shape[1]
        every = counts.double()
        shares = every / every.sum(dim=1, keepdim=True).clamp_min(1.0)
        experts = every.shape[1] - 1
        targets = torch.full((every.shape[1],), (1.0 - skip_target) / experts, dtype=torch.float64)
        targets[-1] = skip_target
        return shares - targets

    @torch.no_grad()
    def update(self, counts: torch.Tensor) -> None:
        """counts: (L, E + 1) GLOBAL routing counts of the step (summed over micro-batches and ranks)."""
        error = self.load_error(counts.cpu(), self.skip_target)
        self.steps += 1
        self.exp_avg.mul_(self.beta1).add_(error, alpha=1 - self.beta1)
        self.exp_avg_sq.mul_(self.beta2).addcmul_(error, error, value=1 - self.beta2)
        m_hat = self.exp_avg / (1 - self.beta1 ** self.steps)
        v_hat = self.exp_avg_sq / (1 - self.beta2 ** self.steps)
        step = self.lr * m_hat / (v_hat.sqrt() + self.eps)
        if self.skip_target is None:
            step -= step.mean(dim=1, keepdim=True)        # the experts' mean kept
        else:
            step = step[:, :-1] - step[:, -1:]            # the skip class's step moves every expert instead
        for layer, bias in enumerate(self.biases):
            bias[:-1] -= step[layer].to(bias.device, bias.dtype)

    def state_dict(self) -> dict:
        return {"exp_avg": self.exp_avg.clone(), "exp_avg_sq": self.exp_avg_sq.clone(), "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
        self.steps = int(state["steps"])
