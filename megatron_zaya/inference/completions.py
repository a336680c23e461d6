"""The OpenAI completions API (POST /v1/completions; Megatron-LM serves it as /completions) over
`generate`, for clients and evaluation harnesses that speak it.

Request fields: prompt (a string, a list of strings, a list of token ids or a list of such lists),
max_tokens (default 16), temperature (default 1; 0 is greedy), top_p (default 1), logprobs (null,
or 0 to 20: also the most likely tokens at each position), echo (default false: the prompt is
part of text and logprobs too), stop (a string or a list of up to 16), seed, n (completions per
prompt, up to 20) and best_of (that many sampled per prompt, the n with the highest mean
log-probability per returned token returned; default n), stream (server-sent events as the tokens are
sampled: inference/streaming.py); model and user are ignored; a null field is its default. Response:
{"id", "object": "text_completion", "created", "model", "choices": [{"index", "text", "logprobs",
"finish_reason"}], "usage"} with prompt i's j-th choice at index i * n + j (the best first when
best_of > n, ranked on the tokens each returns; usage counts the tokens of every sample drawn, each up to
its EOD or stop string); finish_reason is "stop" at the tokenizer's EOD or a stop string, else "length".
The log-probabilities are the model's over its
whole vocabulary (before temperature or top_p), taken during the generation itself: the prompt's in its
prefill, the completion's at each decode step (max_tokens 0 with echo scores the prompt in one pass).
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from megatron_zaya.inference.decode import TokenScores, generate
from megatron_zaya.inference.request_fields import is_int, is_number
from megatron_zaya.inference.sampling import SEED_LIMIT, SamplingParams
from megatron_zaya.inference.server import (MAX_PROMPTS, RequestError, apply_checked_fields, check_length,
                                            check_unicode, check_vocabulary, encode_prompt, request_seed)
from megatron_zaya.inference.text_offsets import LEFT_CONTEXT, GrowingText, prefix_text_lengths, texts_after

MAX_TOP_LOGPROBS = 20
MAX_STOPS = 16          # OpenAI allows 4; evaluation harnesses send more (a task's stop sequences)
MAX_CHOICES = 20        # n and best_of: sequences generated per prompt (OpenAI's bound on best_of)
IGNORED = {"model", "user"}
OFF_VALUES = {"presence_penalty": 0, "frequency_penalty": 0, "logit_bias": {}, "suffix": None}


@dataclass
class CompletionRequest:
    prompts: list            # strings or lists of token ids
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    logprobs: int | None = None
    echo: bool = False
    stop: tuple[str, ...] = ()
    seed: int | None = None
    n: int = 1
    best_of: int | None = None      # None: n
    stream: bool = False            # server-sent events as the tokens are sampled (inference/streaming.py)


def _prompts(prompt) -> list:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(is_int(t) for t in prompt):
            return [list(prompt)]
        if all(isinstance(p, list) and p and all(is_int(t) for t in p) for p in prompt):
            return [list(p) for p in prompt]
    raise RequestError("prompt must be a string, a list of strings, a list of token ids or a list of such lists "
                       "(none empty)")


def parse_completion_request(body) -> CompletionRequest:
    """The request of a JSON body, every field checked (RequestError names the first bad one)."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object, e.g. {\"prompt\": \"Hello\", \"max_tokens\": 16}")
    body = {field: value for field, value in body.items() if value is not None}   # OpenAI: null = the default
    known = {"prompt", "max_tokens", "temperature", "top_p", "logprobs", "echo", "stop", "seed", "n", "best_of", "stream",
             *IGNORED, *OFF_VALUES}
    unknown = sorted(set(body) - known)
    if unknown:
        raise RequestError(f"unknown field(s) {', '.join(unknown)}")
    for field, off in OFF_VALUES.items():
        if body.get(field, off) not in (off, None):
            raise RequestError(f"{field} is not supported by this server (only {json.dumps(off)})")
    if "prompt" not in body:
        raise RequestError("prompt is required")
    request = CompletionRequest(_prompts(body["prompt"]))
    check_unicode(request.prompts, "prompt")
    checks = {
        "max_tokens": (lambda v: is_int(v) and v >= 0, "an integer >= 0"),
        "temperature": (lambda v: is_number(v) and 0 <= v <= 100, "a number in [0, 100]"),
        "top_p": (lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
        "logprobs": (lambda v: v is None or (is_int(v) and 0 <= v <= MAX_TOP_LOGPROBS),
                     f"null or an integer in [0, {MAX_TOP_LOGPROBS}]"),
        "echo": (lambda v: isinstance(v, bool), "a boolean"),
        "stream": (lambda v: isinstance(v, bool), "a boolean"),
        "seed": (lambda v: v is None or (is_int(v) and 0 <= v < SEED_LIMIT),
                 "null or an integer in [0, 2**64)"),
        "n": (lambda v: is_int(v) and 1 <= v <= MAX_CHOICES, f"an integer in [1, {MAX_CHOICES}]"),
        "best_of": (lambda v: v is None or (is_int(v) and 1 <= v <= MAX_CHOICES),
                    f"null or an integer in [1, {MAX_CHOICES}]"),
    }
    apply_checked_fields(body, request, checks)
    per_prompt = f"best_of={request.best_of}" if request.best_of is not None else f"n={request.n}"
    request.best_of = request.n if request.best_of is None else request.best_of
    if request.best_of < request.n:
        raise RequestError(f"best_of={request.best_of} must be >= n={request.n}")
    rows = len(request.prompts) * request.best_of
    if rows > MAX_PROMPTS:          # what bounds the decode cache of one request, as /api's prompt count does
        raise RequestError(f"this request generates {len(request.prompts)} prompt(s) x {per_prompt} = "
                           f"{rows} sequences; at most {MAX_PROMPTS} per request")
    if request.stream and request.echo:
        raise RequestError("echo is not supported with stream (ask without stream for the prompt's text and scores)")
    if request.stream and request.best_of > request.n:
        raise RequestError("best_of > n is not supported with stream")
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not (isinstance(stops, list) and len(stops) <= MAX_STOPS and all(isinstance(s, str) and s for s in stops)):
        raise RequestError(f"stop must be a non-empty string or a list of up to {MAX_STOPS} of them")
    request.stop = tuple(stops)
    if request.max_tokens == 0 and not request.echo:
        raise RequestError("max_tokens=0 returns nothing unless echo=true (to score a prompt)")
    return request


def scored_token(decode, context: list[int], token: int, logprob: float | None,
                 top: dict | None) -> tuple[str, dict | None]:
    """(the token's text at its place after `context`, its top_logprobs entry or None): the alternatives
    of `top` ({id: log-probability}) by their text at that place, most likely first, then the token itself
    when it is not among them (OpenAI's up to logprobs + 1 entries); two ids with one text keep the larger
    value."""
    if top is None:
        return texts_after(decode, context, [token])[0], None
    ids = sorted(top, key=lambda i: -top[i])
    extra = [] if token in top else [token]
    token_text, *texts = texts_after(decode, context, [token] + ids + extra)
    entry: dict[str, float] = {}
    for i, text in zip(ids + extra, texts):
        entry.setdefault(text, top[i] if i in top else logprob)
    return token_text, entry


def logprobs_object(texts: list[str], token_logprobs: list, tops: list | None, text_offsets: list[int]) -> dict:
    """OpenAI's logprobs object: each token's text (`scored_token`), log-probability and text offset, and
    with `tops` (one scored_token entry or None per token) the most likely alternatives by their text."""
    return {"tokens": list(texts), "token_logprobs": list(token_logprobs),
            "top_logprobs": None if tops is None else list(tops), "text_offset": list(text_offsets)}


class Completer:
    """Tokenizes, generates, cuts at stop strings and scores, for one completions request."""

    def __init__(self, service, client_closed=None):
        self.model, self.tokenizer = service.model, service.tokenizer
        self.service, self.client_closed = service, client_closed

    def prompt_ids(self, request: CompletionRequest) -> list[list[int]]:
        config, out = self.model.config, []
        for i, prompt in enumerate(request.prompts):
            ids = encode_prompt(self.tokenizer, i, prompt) if isinstance(prompt, str) else prompt
            if not ids:
                raise RequestError(f"prompt {i} has no tokens")
            check_vocabulary(self.tokenizer, i, ids)
            check_length(config, i, ids, request.max_tokens, "max_tokens")
            out.append(ids)
        return out

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def cut(self, prompt: list[int], new: list[int], stops: tuple[str, ...]) -> tuple[list[int], str, str]:
        """(the completion's tokens, its text, finish_reason): up to EOD, and before the first stop
        string (a token kept if its text starts before the stop)."""
        eod = self.tokenizer.eod
        reason = "length"
        if eod in new:
            new, reason = new[:new.index(eod)], "stop"
        prompt_text = self.decode(prompt)
        whole = self.decode(prompt + new)
        text = whole[len(prompt_text):] if whole.startswith(prompt_text) else self.decode(new)
        ends = [text.find(s) for s in stops if s in text]
        if ends:
            end = min(ends)
            starts = [n - len(prompt_text) for n in
                      prefix_text_lengths(self.decode, prompt + new, range(len(prompt), len(prompt) + len(new)))]
            new = [t for t, start in zip(new, starts) if start < end]
            text, reason = text[:end], "stop"
        return new, text, reason

    def logprobs(self, ids: list[int], first: int, scores: TokenScores) -> dict:
        """OpenAI's logprobs object for ids[first:] (the first token of a sequence has none), from the
        scores of ids[1:] (TokenScores: the prompt's from the prefill, the completion's from the decode)."""
        positions = range(first, len(ids))
        token_logprobs = [scores.logprobs[k - 1] if k else None for k in positions]
        scored = [scored_token(self.decode, ids[max(0, k - LEFT_CONTEXT):k], ids[k], logprob,
                               scores.top[k - 1] if scores.top is not None and k else None)
                  for k, logprob in zip(positions, token_logprobs)]
        return logprobs_object([text for text, _ in scored], token_logprobs,
                               None if scores.top is None else [top for _, top in scored],
                               prefix_text_lengths(self.decode, ids, positions))

    def returned_logprobs(self, result, row: int, kept: list[int]) -> list[float]:
        """What best_of ranks a sample on: the log-probabilities of the tokens it returns (`kept`: those before
        a stop string) and of the EOD that ended it, if one did."""
        ended = result.tokens[row][len(kept):len(kept) + 1] == [self.tokenizer.eod]
        return result.scores[row].logprobs[:len(kept) + ended]

    def until_every_row_ends(self, rows: list[list[int]], stops: tuple[str, ...]):
        """generate's on_step for stop strings: True once every row has sampled EOD or has one of `stops` in
        its text, so that an answer whose stops all came early does not decode on to max_tokens (as
        evaluation harnesses ask, with a large max_tokens and `until` strings). cut() trims the rows after.
        None without stop strings: generate ends at EOD itself."""
        if not stops:
            return None
        texts = [GrowingText(self.decode, row) for row in rows]
        ended = [False] * len(rows)

        def on_step(tokens, scores) -> bool:
            for row, token in enumerate(tokens):
                if token is None or ended[row]:
                    continue
                if token == self.tokenizer.eod:
                    ended[row] = True
                else:
                    text = texts[row].append(token)
                    ended[row] = any(s in text for s in stops)
            return all(ended)
        return on_step

    def respond(self, request: CompletionRequest) -> dict:
        prompts = self.prompt_ids(request)
        greedy = request.temperature == 0
        sampling = SamplingParams(greedy=greedy, temperature=request.temperature, top_p=request.top_p)
        seed = request_seed(request.seed)
        copies, ranked = request.best_of, request.best_of > request.n
        scored = request.logprobs is not None
        choices, generated = [], 0
        with self.service.generating():
            # The log-probabilities come with the generation: the prompt's from its prefill, the completion's
            # from the decode steps (max_tokens 0: the prefill alone, one pass, as evaluation harnesses score).
            # best_of > n ranks each prompt's samples by their generated tokens' mean log-probability.
            rows = [prompt for prompt in prompts for _ in range(copies)]
            result = generate(self.model, rows, request.max_tokens, sampling, eod=self.tokenizer.eod, seed=seed,
                              vocab_limit=self.tokenizer.vocab_size, return_logprobs=scored or ranked,
                              top=request.logprobs or 0,
                              on_step=self.service.stoppable(self.until_every_row_ends(rows, request.stop),
                                                             self.client_closed))
            for i, prompt in enumerate(prompts):
                candidates = list(range(i * copies, (i + 1) * copies))
                cuts = {row: self.cut(prompt, result.tokens[row], request.stop) for row in candidates}
                generated += sum(len(new) for new, _, _ in cuts.values())
                if ranked:
                    candidates.sort(key=lambda row: -mean_logprob(self.returned_logprobs(result, row, cuts[row][0])))
                for j, row in enumerate(candidates[:request.n]):
                    new, text, reason = cuts[row]
                    if request.echo:
                        text = self.decode(prompt) + text
                    logprobs = None
                    if scored:
                        prompt_scores, new_scores = result.prompt_scores[row], result.scores[row]
                        scores = TokenScores(prompt_scores.logprobs + new_scores.logprobs[:len(new)],
                                             None if prompt_scores.top is None else
                                             prompt_scores.top + new_scores.top[:len(new)])
                        logprobs = self.logprobs(prompt + new, 0 if request.echo else len(prompt), scores)
                    choices.append({"index": i * request.n + j, "text": text, "logprobs": logprobs,
                                    "finish_reason": reason})
        prompt_tokens = sum(len(p) for p in prompts)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": self.service.name, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                          "total_tokens": prompt_tokens + generated}}


def mean_logprob(logprobs: list[float]) -> float:
    """best_of's ranking: the mean log-probability of a completion's tokens (0 for none)."""
    return sum(logprobs) / len(logprobs) if logprobs else 0.0


def complete(service, body, client_closed=None) -> dict:
    """POST /v1/completions: the response for a JSON body (RequestError for a bad one; server.ClientClosed
    when client_closed() says its client left during the generation). The HTTP server answers "stream": true
    itself (inference/streaming.py)."""
    request = parse_completion_request(body)
    if request.stream:
        raise RequestError("stream: true is answered by the HTTP server as server-sent events")
    service.log(json.dumps({"completions": len(request.prompts), "max_tokens": request.max_tokens,
                            "logprobs": request.logprobs, "echo": request.echo, "n": request.n,
                            "best_of": request.best_of}))
    return Completer(service, client_closed).respond(request)
