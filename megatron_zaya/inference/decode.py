"""Prefill and token-by-token decode with the CCA inference cache, reusing the model's own modules.

Every step runs the model's stages: embedding and input scaling, then per block the input norm,
`CompressedConvAttention.project(x, LeftContext)` (conv context and delayed value from the cache),
`normalize_and_rotate`, `attend` against the cached K/V, the scaled residual merges and the MoE
sublayer, then the final norm and the (tied) LM head. Only the block's sequencing is restated here
(ZayaBlock.forward calls attention without a cache); tests/inference checks the logits against the
full forward.

Batched prompts of different lengths: each row of the cache is its own sequence with its own length.
`forward_with_cache(..., rows=slice(r, r + 1))` prefills row r alone (no left padding, so the causal
convolution and value shift see exactly that prompt), then decode steps advance all rows together:
row b's new token sits at position `lengths[b]`, RoPE uses that position, and the attention mask lets
it see slots 0..lengths[b] of its own row only.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from megatron_zaya.inference.cache import InferenceCache, LayerCache
from megatron_zaya.inference.loading import compute_dtype, inference_autocast
from megatron_zaya.inference.sampling import SamplingParams, make_generator, sample_next_token
from megatron_zaya.model.rope import rope_cos_sin
from megatron_zaya.model.router import Routing
from megatron_zaya.model.zaya import ZayaModel


def _as_slice(rows, batch_size: int) -> slice:
    if isinstance(rows, int):
        if not 0 <= rows < batch_size:
            raise IndexError(f"cache row {rows} out of range for batch size {batch_size}")
        return slice(rows, rows + 1)
    if not isinstance(rows, slice):
        raise TypeError("rows must be an int or a slice (cache updates go through views)")
    return rows


def _cached_attention(attention, x: torch.Tensor, layer: LayerCache, rows: slice, positions: torch.Tensor,
                      cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, total: int) -> torch.Tensor:
    b = x.shape[0]
    q, k, v, packed, v_delayed = attention.project(x, layer.left_context(rows))
    q, k = attention.normalize_and_rotate(q, k, cos, sin)
    keys, values = layer.keys[rows], layer.values[rows]
    batch_index = torch.arange(b, device=x.device)[:, None]
    keys[batch_index, positions] = k.to(keys.dtype)
    values[batch_index, positions] = v.to(values.dtype)
    # Conv context: the last `conv_context` pre-conv steps of (old context ++ this chunk).
    context = layer.conv_inputs[rows]
    window = torch.cat((context, packed.to(context.dtype)), dim=-1)
    context.copy_(window[..., window.shape[-1] - context.shape[-1]:])
    layer.delayed_value[rows].copy_(v_delayed[:, -1:])
    out = attention.attend(q, keys[:, :total].to(q.dtype), values[:, :total].to(q.dtype), mask)
    return attention.linear_proj(out)


# Scoring a prompt takes the LM head over this many logits at a time (256 positions of ZAYA1-base's
# 262K vocabulary, 256 MiB in fp32), not over the whole (S, V) at once (4.3 GB at 4K tokens).
SCORE_BLOCK_LOGITS = 1 << 26


@torch.no_grad()
def forward_with_cache(model: ZayaModel, cache: InferenceCache, tokens: torch.Tensor, rows=slice(None),
                       all_logits: bool = False, return_routing: bool = False):
    """Continue the sequences in cache `rows` with `tokens` (b, s): every row gets s more tokens.

    Returns fp32 logits (b, s, V) if all_logits else (b, V) for the last token; with
    return_routing also the list of per-layer `Routing` over the b*s tokens. A model with bf16/fp16
    weights runs under autocast to that dtype (see loading.inference_autocast)."""
    with inference_autocast(model):
        hidden, routing = _hidden_with_cache(model, cache, tokens, rows, all_logits)
        logits = lm_logits(model, hidden)
    return (logits, routing) if return_routing else logits


def lm_logits(model: ZayaModel, hidden: torch.Tensor) -> torch.Tensor:
    """fp32 logits of final-normed hidden states (..., D) -> (..., V)."""
    if hasattr(model, "head_and_loss"):       # the model's LM head (vocab-parallel under tensor parallelism)
        logits, _ = model.head_and_loss(hidden, None)
    else:
        logits = F.linear(hidden, model.output_weight())
    return logits.float()


def _hidden_with_cache(model, cache, tokens, rows, all_positions):
    """The final-normed hidden states (b, s, D), or (b, D) of the last token, and the routing."""
    rows = _as_slice(rows, cache.batch_size)
    b, s = tokens.shape
    start = cache.lengths[rows]
    if start.shape[0] != b:
        raise ValueError(f"tokens have {b} rows but cache rows {rows} select {start.shape[0]}")
    end = start + s
    if int(end.max()) > cache.max_length:
        raise ValueError(f"inference cache is full: {int(end.max())} tokens > max_length {cache.max_length}")
    config = model.config
    positions = start[:, None] + torch.arange(s, device=tokens.device)           # (b, s)
    cos, sin = rope_cos_sin(positions, config.rotary_dim, config.rotary_base)
    total = int(end.max())
    slots = torch.arange(total, device=tokens.device)
    mask = (slots[None, None, :] <= positions[:, :, None]).unsqueeze(1)            # (b, 1, s, total)

    residual = model.input_scaling(model.embedding(tokens))
    router_state = None
    routing: list[Routing] = []
    for block, layer in zip(model.layers, cache.layers):
        attn_out = _cached_attention(block.attention, block.input_norm(residual), layer, rows, positions,
                                     cos, sin, mask, total)
        residual, normed = block.attention_residual.forward_and_norm(attn_out, residual, block.pre_mlp_norm)
        moe_out, router_state, layer_routing = block.moe(normed, router_state)
        residual = block.mlp_residual(moe_out, residual)
        routing.append(layer_routing)
    cache.lengths[rows] = end
    if not all_positions:
        residual = residual[:, -1]
    return model.final_norm(residual), routing


@dataclass
class TokenScores:
    logprobs: list[float]                       # log p(token | the tokens before it), one per scored token
    top: list[dict[int, float]] | None = None   # per scored token: the `top` most likely ids and their log p


@torch.no_grad()
def prefill(model: ZayaModel, cache: InferenceCache, row: int, prompt: torch.Tensor | list[int],
            chunk_size: int | None = None, return_logprobs: bool = False, top: int = 0,
            vocab_limit: int | None = None):
    """Reset cache row `row` and run `prompt` (1-D token ids) into it, in chunks of `chunk_size`
    tokens if given (bounds the S x S attention memory). Returns the last token's logits (V,), and
    with `return_logprobs` also the TokenScores of each prompt token after the first under the model
    (len(prompt) - 1 of them, with the `top` most likely ids among the first `vocab_limit` at each
    position when top > 0; the LM head runs SCORE_BLOCK_LOGITS logits at a time, never over the whole (S, V))."""
    prompt = torch.as_tensor(prompt, dtype=torch.long, device=cache.lengths.device).reshape(-1)
    if prompt.shape[0] == 0:
        raise ValueError(f"prompt {row} is empty: give at least one token (e.g. --add-bos)")
    cache.reset(slice(row, row + 1))
    return extend(model, cache, row, prompt, chunk_size, return_logprobs, top, vocab_limit)


@torch.no_grad()
def extend(model: ZayaModel, cache: InferenceCache, row: int, tokens: torch.Tensor | list[int],
           chunk_size: int | None = None, return_logprobs: bool = False, top: int = 0,
           vocab_limit: int | None = None, previous_logits: torch.Tensor | None = None):
    """Run `tokens` (1-D, at least one) into cache row `row` after what it holds, as `prefill` does. The
    TokenScores are those of tokens[1:], and of tokens[0] too when `previous_logits` (V,), the logits
    before it, are given (a prompt continued after a prefix that other rows share)."""
    tokens = torch.as_tensor(tokens, dtype=torch.long, device=cache.lengths.device).reshape(1, -1)
    chunk = chunk_size or tokens.shape[1]
    scores = TokenScores([], [] if top else None)
    if return_logprobs and previous_logits is not None:
        add_scores(scores, previous_logits[None], tokens[0, :1], top, vocab_limit)
    for begin in range(0, tokens.shape[1], chunk):
        if not return_logprobs:
            logits = forward_with_cache(model, cache, tokens[:, begin:begin + chunk], rows=row)
            continue
        with inference_autocast(model):
            hidden, _ = _hidden_with_cache(model, cache, tokens[:, begin:begin + chunk], row, True)
            # the next token of each position (the last token's is scored at decode)
            targets = tokens[0, begin + 1:begin + chunk + 1]
            score_positions(scores, model, hidden[0, :targets.shape[0]], targets, top, vocab_limit)
            logits = lm_logits(model, hidden[:, -1])
    return (logits[0], scores) if return_logprobs else logits[0]


def score_positions(scores: TokenScores, model: ZayaModel, hidden: torch.Tensor, targets: torch.Tensor, top: int,
                    vocab_limit: int | None) -> None:
    """add_scores of each position's next token `targets` (N,) from its final hidden state (N, D), the LM head
    a block of SCORE_BLOCK_LOGITS logits at a time."""
    block = max(1, SCORE_BLOCK_LOGITS // model.config.vocab_size)
    for first in range(0, hidden.shape[0], block):
        add_scores(scores, lm_logits(model, hidden[first:first + block]), targets[first:first + block], top,
                   vocab_limit)


@torch.no_grad()
def extend_rows(model: ZayaModel, cache: InferenceCache, first_row: int, tokens: list[list[int]],
                return_logprobs: bool = False, top: int = 0, vocab_limit: int | None = None,
                previous_logits: torch.Tensor | None = None) -> list:
    """`extend` of k consecutive cache rows (first_row .. first_row + k - 1, holding the same prefix, whose
    last logits are `previous_logits`) by k token lists, one row each, in one forward: per row the logits
    after its tokens, with `return_logprobs` as (logits, TokenScores of all its tokens), as `extend` gives.
    Lists of different lengths are padded at the end: a row's outputs are its own (attention, convolutions
    and routing never look ahead), but its cache then holds the padding, so nothing may run after it."""
    k, longest = len(tokens), max(len(t) for t in tokens)
    lengths = torch.tensor([len(t) for t in tokens], device=cache.lengths.device)
    batch = torch.tensor([t + [t[-1]] * (longest - len(t)) for t in tokens], dtype=torch.long,
                         device=cache.lengths.device)
    rows = slice(first_row, first_row + k)
    with inference_autocast(model):
        hidden, _ = _hidden_with_cache(model, cache, batch, rows, True)            # (k, longest, D)
        last = lm_logits(model, hidden[torch.arange(k, device=batch.device), lengths - 1])
        if not return_logprobs:
            return list(last)
        rest = TokenScores([], [] if top else None)
        real = torch.arange(longest - 1, device=batch.device)[None] < (lengths - 1)[:, None]   # j predicts j + 1
        score_positions(rest, model, hidden[:, :-1][real], batch[:, 1:][real], top, vocab_limit)
    first = TokenScores([], [] if top else None)
    add_scores(first, previous_logits[None].expand(k, -1), batch[:, 0], top, vocab_limit)
    out, start = [], 0
    for i, own in enumerate(lengths.tolist()):
        mine = slice(start, start + own - 1)
        start += own - 1
        out.append((last[i], TokenScores([first.logprobs[i]] + rest.logprobs[mine],
                                         None if top == 0 else [first.top[i]] + rest.top[mine])))
    return out


MIN_SHARED_PREFIX = 8       # tokens two prompts must share for one prefill of them (besides identical prompts)


def common_prefix_length(a: list[int], b: list[int], start: int = 0) -> int:
    """The length of a's and b's common prefix, compared from `start` (known equal before it)."""
    n = min(len(a), len(b))
    return next((i for i in range(start, n) if a[i] != b[i]), n)


def shared_prefix_groups(prompts: list[list[int]]) -> list[list[int]]:
    """The rows of each group, every row in exactly one group: a row joins the group of the first earlier
    row it shares at least MIN_SHARED_PREFIX tokens with (or all its tokens, an identical prompt)."""
    groups, grouped = [], set()
    for first, prompt in enumerate(prompts):
        if first in grouped:
            continue
        rows = [first] + [other for other in range(first + 1, len(prompts)) if other not in grouped
                          and _shares_prefix(prompt, prompts[other])]
        grouped.update(rows)
        groups.append(rows)
    return groups


def _shares_prefix(prompt: list[int], other: list[int]) -> bool:
    common = common_prefix_length(prompt, other)
    return common >= MIN_SHARED_PREFIX or common == len(prompt) == len(other)


def prefill_rows(model: ZayaModel, cache: InferenceCache, prompts: list[list[int]], chunk_size: int | None,
                 return_logprobs: bool, top: int, vocab_limit: int | None, scoring_only: bool = False) -> list:
    """`prefill` of every prompt into its row, each shared prefix run once, at every depth: the prompts of a
    group (shared_prefix_groups) are filled as the tree of their common prefixes (_PrefixTree: e.g. a few-shot
    header all share, then a question's context its answers share, then each answer), each prefix run into
    one row and copied to the rows that continue it (InferenceCache.copy_row), the first token after it scored
    from its last logits. What a row gets equals its own prefill (tested). A prompt given again (n copies) is
    prefilled once in all, then copied. `scoring_only` (nothing runs into the cache afterwards) lets sibling
    answers of different lengths share a forward (_PrefixTree.batched_leaves). The prompts are filled in
    sorted order, so that those sharing a prefix sit on consecutive cache rows whatever order they came in
    (an evaluation harness sorts its requests by length), then the rows go back to the prompts' order.
    Returns prefill's result per row."""
    order = sorted(range(len(prompts)), key=lambda row: prompts[row])
    if order != list(range(len(prompts))):
        filled = prefill_rows(model, cache, [prompts[row] for row in order], chunk_size, return_logprobs, top,
                              vocab_limit, scoring_only)
        position = {row: at for at, row in enumerate(order)}
        cache.reorder([position[row] for row in range(len(prompts))])
        return [filled[position[row]] for row in range(len(prompts))]
    results: list = [None] * len(prompts)
    first_row: dict[tuple, int] = {}
    unique = [row for row, prompt in enumerate(prompts) if first_row.setdefault(tuple(prompt), row) == row]
    tree = _PrefixTree(model, cache, prompts, chunk_size, return_logprobs, top, vocab_limit, results, scoring_only)
    for members in shared_prefix_groups([prompts[row] for row in unique]):
        tree.fill([unique[m] for m in members], 0, None, None)
    for row, prompt in enumerate(prompts):
        source = first_row[tuple(prompt)]
        if source != row:
            cache.copy_row(source, row)
            results[row] = tree.result(*results[source]) if return_logprobs else results[source]
    return results


class _PrefixTree:
    """Fills cache rows of distinct prompts that share prefixes: `fill` runs a group's common prefix into
    its first row, copies that row to the first row of every branch (the prompts continuing with the
    same next token) and fills each branch from there; a prompt that ends at the prefix keeps it."""

    def __init__(self, model, cache, prompts, chunk_size, return_logprobs, top, vocab_limit, results, ragged):
        self.model, self.cache, self.prompts, self.results = model, cache, prompts, results
        self.options = (chunk_size, return_logprobs, top, vocab_limit)
        self.return_logprobs, self.ragged = return_logprobs, ragged

    def result(self, logits, scores):
        """A row's own (logits, TokenScores): the decode appends to its scores' lists."""
        if not self.return_logprobs:
            return logits
        return logits, TokenScores(list(scores.logprobs), None if scores.top is None else list(scores.top))

    def joined(self, scores, new):
        """The TokenScores of a prefix (`scores`, None: none) followed by `new`."""
        if scores is None:
            return new
        return TokenScores(scores.logprobs + new.logprobs, None if scores.top is None else scores.top + new.top)

    def run(self, row: int, tokens: list[int], logits, scores):
        """Run tokens into `row` after what it holds (prefill when logits is None: nothing yet); returns
        the logits after them and the TokenScores of every token of the row so far."""
        if logits is None:
            out = prefill(self.model, self.cache, row, tokens, *self.options)
        else:
            out = extend(self.model, self.cache, row, tokens, *self.options, previous_logits=logits)
        if not self.return_logprobs:
            return out, None
        logits, new = out
        return logits, self.joined(scores, new)

    def batched_leaves(self, branches: list[list[int]], length: int) -> list[list[int]]:
        """Runs of consecutive rows, among the one-prompt branches, whose prompts have the same number of
        tokens after the shared `length` (e.g. the answers " A" .. " D" of one question), or any number when
        nothing runs after the prefill (`ragged`: scoring only, e.g. lm-evaluation-harness's continuations):
        each runs as one forward (extend_rows) instead of one per row. Only within the chunk size."""
        chunk = self.options[0]
        by_rest: dict[int, list[int]] = {}
        for branch in branches:
            rest = len(self.prompts[branch[0]]) - length
            if len(branch) == 1 and (chunk is None or rest <= chunk):
                by_rest.setdefault(0 if self.ragged else rest, []).append(branch[0])
        runs = []
        for rows in by_rest.values():
            rows.sort()
            current = [rows[0]]
            for row in rows[1:]:
                if row == current[-1] + 1:
                    current.append(row)
                else:
                    runs.append(current)
                    current = [row]
            runs.append(current)
        return [run for run in runs if len(run) > 1]

    def run_batch(self, rows: list[int], length: int, logits, scores) -> None:
        """Fill the consecutive rows `rows` (each holding the shared prefix) with their prompts' rest."""
        _, return_logprobs, top, vocab_limit = self.options
        outs = extend_rows(self.model, self.cache, rows[0], [self.prompts[row][length:] for row in rows],
                           return_logprobs, top, vocab_limit, logits)
        for row, out in zip(rows, outs):
            self.results[row] = (out[0], self.joined(scores, out[1])) if return_logprobs else out

    def fill(self, rows: list[int], depth: int, logits, scores) -> None:
        """rows share their first `depth` tokens, held by cache row rows[0] (`logits` after them, their
        `scores`; depth 0: nothing yet)."""
        head = rows[0]
        length = min(common_prefix_length(self.prompts[head], self.prompts[row], depth) for row in rows)
        if length > depth:
            logits, scores = self.run(head, self.prompts[head][depth:length], logits, scores)
        branches: dict[int, list[int]] = {}
        for row in rows:
            if len(self.prompts[row]) == length:        # the prefix is this whole prompt (one row at most)
                if row != head:
                    self.cache.copy_row(head, row)
                self.results[row] = self.result(logits, scores)
            else:
                branches.setdefault(self.prompts[row][length], []).append(row)
        for branch in branches.values():              # every branch gets the prefix before any extends it
            if head in branch:
                branch.insert(0, branch.pop(branch.index(head)))
            else:
                self.cache.copy_row(head, branch[0])
        batched = self.batched_leaves(list(branches.values()), length) if logits is not None else []
        for rows in batched:
            self.run_batch(rows, length, logits, scores)
        done = {row for rows in batched for row in rows}
        for branch in branches.values():
            if branch[0] not in done:
                self.fill(branch, length, logits, scores)


def add_scores(scores: TokenScores, logits: torch.Tensor, tokens: torch.Tensor, top: int,
               vocab_limit: int | None) -> None:
    """Append log p(tokens[i]) under logits[i] (N, V), over the whole (padded) vocabulary as the training
    loss counts it (fp32), and, with top > 0, the `top` most likely ids of each row among the first
    `vocab_limit` (the tokenizer's: padded rows have no text)."""
    if logits.shape[0] != tokens.numel():
        raise ValueError(f"add_scores: {logits.shape[0]} rows of logits for {tokens.numel()} tokens")
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    scores.logprobs += logprobs.gather(-1, tokens.reshape(-1, 1)).squeeze(-1).tolist()
    if top:
        best = logprobs[:, :vocab_limit].topk(top, dim=-1)
        scores.top += [dict(zip(i.tolist(), v.tolist())) for v, i in zip(best.values, best.indices)]


@dataclass
class GenerationOutput:
    prompts: list[list[int]]
    tokens: list[list[int]]                 # generated ids per row (ends with EOD if it stopped there)
    stopped_at_eod: list[bool] = field(default_factory=list)
    # with return_logprobs: the scores of each prompt token after the first, and of each generated token
    prompt_scores: list[TokenScores] | None = None
    scores: list[TokenScores] | None = None

    @property
    def prompt_logprobs(self) -> list[list[float]] | None:
        return None if self.prompt_scores is None else [s.logprobs for s in self.prompt_scores]

    @property
    def logprobs(self) -> list[list[float]] | None:
        return None if self.scores is None else [s.logprobs for s in self.scores]


@torch.no_grad()
def generate(model: ZayaModel, prompts: list[list[int]], max_new_tokens: int,
             sampling: SamplingParams | None = None, eod: int | None = None, seed: int = 1234,
             vocab_limit: int | None = None, prefill_chunk: int | None = None,
             dtype: torch.dtype | None = None, return_logprobs: bool = False, top: int = 0,
             on_step=None) -> GenerationOutput:
    """Sample up to `max_new_tokens` per prompt; a row stops at `eod` (when given).

    Prompts may have different lengths: each is prefilled into its own cache row (a prefix several share
    once, then copied: prefill_rows), then all rows decode together (rows that already stopped keep
    stepping; their tokens are discarded). `on_step(tokens, scores)`, when given, sees each step as it
    is sampled: the new token of every row (None for a row already stopped) and, with return_logprobs,
    the step's TokenScores (one entry per row); a true return ends the generation there (streaming).
    `return_logprobs`: also the model's log-probabilities of the prompt and generated tokens (over
    the whole vocabulary, before temperature, top-k or top-p), with `top` > 0 the most likely ids at
    each position too (among the first `vocab_limit`); max_new_tokens 0 scores the prompts in one pass."""
    sampling = sampling or SamplingParams()
    if not prompts:
        raise ValueError("generate: no prompts")
    if max_new_tokens < 0:
        raise ValueError(f"--max-new-tokens={max_new_tokens} must be >= 0")
    prompts = [[int(t) for t in p] for p in prompts]
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {i} is empty: give at least one token (e.g. --add-bos)")
        bad = [t for t in p if not 0 <= t < model.config.vocab_size]
        if bad:
            raise ValueError(f"prompt {i}: token ids {bad[:5]} outside the vocabulary [0, {model.config.vocab_size})")
    if max_new_tokens == 0 and not return_logprobs:      # nothing to generate or score: no forward at all
        return GenerationOutput(prompts, [[] for _ in prompts], [False] * len(prompts))
    param = next(model.parameters())
    max_length = max(len(p) for p in prompts) + max_new_tokens
    if max_length > model.config.max_position_embeddings:
        raise ValueError(f"prompt + --max-new-tokens = {max_length} tokens exceeds the model's "
                         f"max_position_embeddings {model.config.max_position_embeddings}")
    cache = InferenceCache(model.config, len(prompts), max_length, param.device, dtype or compute_dtype(model))
    # A prompt repeated (n or best_of samples) or sharing a prefix with others (the contexts of a multiple-choice
    # question) has that part prefilled once.
    # max_new_tokens <= 1: the first new token comes from the prefill's logits, nothing runs into the cache after
    prefilled = prefill_rows(model, cache, prompts, prefill_chunk, return_logprobs, top, vocab_limit,
                             scoring_only=max_new_tokens <= 1)
    last = torch.stack([x[0] for x in prefilled] if return_logprobs else prefilled)
    generator = make_generator(seed, param.device)
    out = [[] for _ in prompts]
    scores = [TokenScores([], [] if top else None) for _ in prompts]
    stopped = [False] * len(prompts)
    for step in range(max_new_tokens):
        next_tokens = sample_next_token(last, sampling, generator, vocab_limit)
        step_scores = TokenScores([], [] if top else None)
        if return_logprobs:
            add_scores(step_scores, last, next_tokens, top, vocab_limit)
        tokens = next_tokens.tolist()
        step_tokens = [None if done else token for done, token in zip(stopped, tokens)] if on_step else None
        for row, token in enumerate(tokens):
            if not stopped[row]:
                out[row].append(token)
                if return_logprobs:
                    scores[row].logprobs.append(step_scores.logprobs[row])
                    if top:
                        scores[row].top.append(step_scores.top[row])
                stopped[row] = eod is not None and token == eod
        if on_step is not None and on_step(step_tokens, step_scores if return_logprobs else None):
            break
        if all(stopped) or step == max_new_tokens - 1:
            break
        last = forward_with_cache(model, cache, next_tokens[:, None])
    if not return_logprobs:
        return GenerationOutput(prompts, out, stopped)
    return GenerationOutput(prompts, out, stopped, [x[1] for x in prefilled], scores)
