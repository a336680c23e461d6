"""Log-probabilities of a token sequence under the model: each token after the first, and
optionally the `top` most likely tokens at each position (what an evaluation harness asks a
completions API for). One forward through the inference cache, in chunks of `chunk` positions so
that no (S, V) logits tensor of a long sequence is ever held whole.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from megatron_zaya.inference.cache import InferenceCache
from megatron_zaya.inference.decode import forward_with_cache, token_logprobs
from megatron_zaya.inference.loading import compute_dtype


@dataclass
class TokenScores:
    logprobs: list[float]                  # log p(ids[i] | ids[:i]) for i = 1 .. len(ids) - 1
    top: list[dict[int, float]] | None     # per such position: the `top` most likely ids and their log p


@torch.no_grad()
def score(model, ids: list[int], top: int = 0, chunk: int = 512, vocab_limit: int | None = None) -> TokenScores:
    """The model's log-probabilities over its whole vocabulary (as the training loss counts them);
    the top tokens only among the first `vocab_limit` ids (the tokenizer's: padded rows have no text)."""
    if len(ids) < 1:
        raise ValueError("score: no tokens")
    param = next(model.parameters())
    cache = InferenceCache(model.config, 1, len(ids), param.device, compute_dtype(model))
    tokens = torch.as_tensor(ids, dtype=torch.long, device=param.device).reshape(1, -1)
    logprobs: list[float] = []
    tops: list[dict[int, float]] = []
    for begin in range(0, len(ids), chunk):
        logits = forward_with_cache(model, cache, tokens[:, begin:begin + chunk], rows=0, all_logits=True)[0]
        targets = tokens[0, begin + 1:begin + chunk + 1]
        logits = logits[:targets.shape[0]]
        logprobs += token_logprobs(logits, targets).tolist()
        if top:
            best = torch.log_softmax(logits.float(), dim=-1)[:, :vocab_limit].topk(top, dim=-1)
            tops += [dict(zip(i.tolist(), v.tolist())) for v, i in zip(best.values, best.indices)]
    return TokenScores(logprobs, tops if top else None)
