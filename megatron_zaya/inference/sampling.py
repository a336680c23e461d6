"""Next-token sampling: greedy, temperature, top-k, top-p (nucleus), reproducible with a seeded generator.

Order of operations (as in most samplers): restrict to the real vocabulary (`vocab_limit`: the
padded embedding rows past the tokenizer's vocabulary are never sampled), divide by the
temperature, keep the top-k logits, keep the smallest set of tokens whose probability reaches
top-p (always at least the most likely one), sample from the renormalised distribution.
Greedy (temperature 0, top-k 1 or `greedy=True`) takes the argmax; ties go to the lowest id. The
temperature divides the logits after their row maximum is subtracted (the same distribution), so a
tiny temperature concentrates on the top tokens instead of overflowing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from megatron_zaya.inference.request_fields import SEED_LIMIT


@dataclass
class SamplingParams:
    greedy: bool = False
    temperature: float = 1.0
    top_k: int = 0            # 0: off
    top_p: float = 1.0        # 1.0: off

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"--temperature={self.temperature} must be a finite number >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise ValueError(f"--top-k={self.top_k} must be >= 0 (0 = off)")
        if not 0 < self.top_p <= 1:           # NaN fails this too
            raise ValueError(f"--top-p={self.top_p} must be in (0, 1]")

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0 or self.top_k == 1


def check_seed(seed, name: str = "--seed") -> int:
    """The seed as an int, or ValueError naming `name` when torch's generator cannot take it."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"{name}={seed!r} must be an integer in [0, 2**64)")
    return seed


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(int(seed))


def filter_logits(logits: torch.Tensor, params: SamplingParams, vocab_limit: int | None = None) -> torch.Tensor:
    """fp32 logits (B, V) with temperature applied and every excluded token set to -inf."""
    logits = logits.float().clone()
    if vocab_limit is not None and vocab_limit < logits.shape[-1]:
        logits[:, vocab_limit:] = float("-inf")
    if params.temperature not in (0, 1):
        top = logits.amax(dim=-1, keepdim=True)
        # <= 0, 0 at the top token: nothing overflows (a very negative quotient is -inf, as it should be). A
        # temperature below float32's smallest normal number divides as that number: 0 / 0 cannot happen, and
        # every token but the top ones already has probability 0 there.
        logits = (logits - top) / max(params.temperature, torch.finfo(torch.float32).tiny)
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p.
        drop = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
        drop[:, 0] = False
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return logits


def sample_next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None,
                      vocab_limit: int | None = None) -> torch.Tensor:
    """logits (B, V) -> next token ids (B,) int64."""
    if params.is_greedy:
        logits = logits.float()
        if vocab_limit is not None and vocab_limit < logits.shape[-1]:
            logits = logits[:, :vocab_limit]
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(filter_logits(logits, params, vocab_limit), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)
