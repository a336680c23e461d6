"""Held-out loss, perplexity and per-expert routing statistics of a model over a stream of batches.

    result = evaluate(model, batches)        # batches: dicts with tokens, labels, loss_mask[, position_ids,
                                             # document_ids (B, S): packed documents kept apart]
    print(format_table(result))

Loss is the mean per-token cross-entropy over the tokens `loss_mask` keeps (summed over all batches,
then divided by their count, so a short last batch weighs by its tokens), perplexity exp(loss).
Routing statistics per MoE layer, over every token the model saw (E experts + the skip class):
- load[e]: share of all tokens routed to expert e (the loads and skip_rate sum to 1);
- skip_rate: share of tokens routed to the skip class (no expert compute);
- load_entropy: entropy of the expert load among non-skipped tokens / log E (1 = perfectly balanced);
- max_load: largest expert share among non-skipped tokens x E (1 = balanced, E = collapsed);
- router_entropy: mean over tokens of the router distribution's entropy / log(E + 1) (how unsure
  each routing decision is).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable

import torch

from megatron_zaya.inference.loading import inference_autocast
from megatron_zaya.model.zaya import ZayaModel
from megatron_zaya.training.validation_report import perplexity


@dataclass
class LayerRoutingStats:
    counts: torch.Tensor                 # (E + 1,) int64 tokens per class, skip class last
    router_entropy_sum: float = 0.0      # sum over tokens of the router entropy (nats)

    @property
    def tokens(self) -> int:
        return int(self.counts.sum())

    @property
    def num_experts(self) -> int:
        return self.counts.numel() - 1

    @property
    def load(self) -> list[float]:
        return (self.counts[:-1].double() / max(self.tokens, 1)).tolist()

    @property
    def skip_rate(self) -> float:
        return float(self.counts[-1]) / max(self.tokens, 1)

    def _expert_shares(self) -> torch.Tensor:
        routed = self.counts[:-1].double()
        return routed / routed.sum().clamp_min(1)

    @property
    def load_entropy(self) -> float:
        p = self._expert_shares()
        h = -(p * p.clamp_min(1e-30).log()).sum().item()
        return h / math.log(self.num_experts) if self.num_experts > 1 else 1.0

    @property
    def max_load(self) -> float:
        return float(self._expert_shares().max()) * self.num_experts

    @property
    def router_entropy(self) -> float:
        return self.router_entropy_sum / max(self.tokens, 1) / math.log(self.num_experts + 1)

    def as_dict(self) -> dict:
        return {"tokens": self.tokens, "load": self.load, "skip_rate": self.skip_rate,
                "load_entropy": self.load_entropy, "max_load": self.max_load, "router_entropy": self.router_entropy}


@dataclass
class EvalResult:
    loss_sum: float = 0.0
    loss_tokens: float = 0.0
    samples: int = 0
    batches: int = 0
    layers: list[LayerRoutingStats] = field(default_factory=list)

    @property
    def loss(self) -> float:
        return self.loss_sum / self.loss_tokens if self.loss_tokens else float("nan")

    @property
    def perplexity(self) -> float:
        return perplexity(self.loss)          # the training log's (capped the same way)

    def as_dict(self) -> dict:
        return {"loss": self.loss, "perplexity": self.perplexity, "tokens": self.loss_tokens, "samples": self.samples,
                "batches": self.batches, "routing": [layer.as_dict() for layer in self.layers]}


@torch.no_grad()
def evaluate(model: ZayaModel, batches: Iterable[dict], max_batches: int | None = None) -> EvalResult:
    device = next(model.parameters()).device
    model.eval()
    result = EvalResult()
    for batch in batches:
        if max_batches is not None and result.batches >= max_batches:
            break
        tokens = batch["tokens"].to(device)
        labels = batch["labels"].to(device)
        loss_mask = batch.get("loss_mask")
        loss_mask = torch.ones_like(labels, dtype=torch.float32) if loss_mask is None else loss_mask.to(device).float()
        position_ids = batch.get("position_ids")
        document_ids = batch.get("document_ids")       # --reset-attention-mask
        with inference_autocast(model):
            out = model(tokens, labels=labels, position_ids=None if position_ids is None else position_ids.to(device),
                        document_ids=None if document_ids is None else document_ids.to(device))
        result.loss_sum += float((out.token_losses.float() * loss_mask).sum())
        result.loss_tokens += float(loss_mask.sum())
        result.samples += tokens.shape[0]
        result.batches += 1
        if not result.layers:
            result.layers = [LayerRoutingStats(torch.zeros_like(r.counts, device="cpu")) for r in out.routing]
        for stats, routing in zip(result.layers, out.routing):
            stats.counts += routing.counts.cpu()
            probs = routing.probs.float()
            stats.router_entropy_sum += float(-(probs * probs.clamp_min(1e-30).log()).sum())
    return result


def format_table(result: EvalResult) -> str:
    lines = [f"loss {result.loss:.4f}   perplexity {result.perplexity:.3f}   "
             f"({int(result.loss_tokens):,} tokens, {result.samples} samples, {result.batches} batches)"]
    if result.layers:
        e = result.layers[0].num_experts
        lines.append("")
        lines.append(f"{'layer':>5} {'skip':>6} {'load_H':>7} {'max/mean':>8} {'router_H':>8}   load per expert (share of tokens)")
        for i, layer in enumerate(result.layers):
            loads = " ".join(f"{x:.3f}" for x in layer.load) if e <= 32 else f"(min {min(layer.load):.3f}, max {max(layer.load):.3f})"
            lines.append(f"{i:>5} {layer.skip_rate:>6.3f} {layer.load_entropy:>7.3f} {layer.max_load:>8.2f} "
                         f"{layer.router_entropy:>8.3f}   {loads}")
    return "\n".join(lines)


def write_tensorboard(result: EvalResult, log_dir: str, step: int = 0, prefix: str = "eval") -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=log_dir)
    try:
        writer.add_scalar(f"{prefix}/loss", result.loss, step)
        writer.add_scalar(f"{prefix}/perplexity", result.perplexity, step)
        for i, layer in enumerate(result.layers):
            tag = f"{prefix}-routing/layer_{i:02d}"
            writer.add_scalar(f"{tag}/skip_rate", layer.skip_rate, step)
            writer.add_scalar(f"{tag}/load_entropy", layer.load_entropy, step)
            writer.add_scalar(f"{tag}/max_load", layer.max_load, step)
            writer.add_scalar(f"{tag}/router_entropy", layer.router_entropy, step)
            for e, share in enumerate(layer.load):
                writer.add_scalar(f"{tag}/load_expert_{e:02d}", share, step)
    finally:
        writer.close()
