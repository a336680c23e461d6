"""Streamed completions: POST /v1/completions with "stream": true, as server-sent events while the tokens
are sampled (OpenAI's format).

Each event is `data: <JSON>` and a blank line; the JSON is a text_completion chunk with one choice: the
text that became final since that choice's previous chunk and, with `logprobs`, the log-probabilities of
the tokens sampled since. Text waits while it could still be the start of a stop string, or ends in an
unfinished character (a multi-byte character split over tokens decodes to U+FFFD until its last byte).
A choice's last chunk carries its finish_reason ("stop" at EOD or a stop string, "length"); the stream
ends with `data: [DONE]`. A choice's chunks joined give the text, tokens and log-probabilities the same
request gives unstreamed (tests/inference/test_inference_server.py). `echo` and best_of > n are refused
with stream, as OpenAI does for best_of.
"""
from __future__ import annotations

import time
import uuid

from megatron_zaya.inference.completions import logprobs_object, scored_token
from megatron_zaya.inference.decode import generate
from megatron_zaya.inference.sampling import SamplingParams
from megatron_zaya.inference.server import request_seed
from megatron_zaya.inference.text_offsets import LEFT_CONTEXT, GrowingText


class ChoiceStream:
    """One choice's state: where its kept tokens' text starts, the text already sent, the log-probabilities
    not yet sent."""

    def __init__(self, completer, prompt: list[int], index: int, stops: tuple[str, ...], logprobs: int | None):
        self.completer, self.index, self.stops, self.logprobs = completer, index, stops, logprobs
        self.growing = GrowingText(completer.decode, prompt)   # the completion's text, decoded as it grows
        self.prompt_chars = len(completer.decode(prompt)) if logprobs is not None else 0
        self.starts: list[int] = []         # where each kept token's text starts in the completion text
        self.sent_chars = 0
        self.pending: list[tuple[str | None, float, dict | None]] = []  # (text, logprob, top) not yet sent
        self.finish_reason: str | None = None
        self.hold = max((len(s) for s in stops), default=1) - 1

    def add(self, token: int, eod: int | None, logprob: float | None, top: dict | None) -> list[dict]:
        """The chunks this sampled token releases (none, one, or the choice's last)."""
        if token == eod:
            return self.finish("stop")
        self.starts.append(len(self.growing.text))
        if self.logprobs is not None:        # the token's text and top_logprobs at its place, as unstreamed
            context = self.growing.context + self.growing.tokens[-LEFT_CONTEXT:]
            token_text, entry = scored_token(self.completer.decode, context, token, logprob,
                                             top if self.logprobs else None)
            self.pending.append((token_text, logprob, entry))
        else:
            self.pending.append((None, logprob, None))
        text = self.growing.append(token)
        ends = [text.find(s) for s in self.stops if s in text]
        if ends:
            end = min(ends)
            kept = sum(1 for start in self.starts if start < end)      # tokens whose text starts before the stop
            self.pending = self.pending[:len(self.pending) - (len(self.starts) - kept)]
            self.starts = self.starts[:kept]
            return self.finish("stop", text[:end])
        safe = text[:max(self.sent_chars, len(text) - self.hold)].rstrip("\ufffd")
        return [self.chunk(safe[self.sent_chars:])] if len(safe) > self.sent_chars else []

    def finish(self, reason: str, text: str | None = None) -> list[dict]:
        self.finish_reason = reason
        text = self.growing.text if text is None else text
        return [self.chunk(text[self.sent_chars:], reason)]

    def chunk(self, delta: str, finish_reason: str | None = None) -> dict:
        """The chunk of `delta`, with the log-probabilities of the pending tokens whose text has begun in
        the text sent so far (all of them in the last chunk): a token whose text is still held back, as
        the possible start of a stop string, waits, since the stop may yet drop it."""
        released_end = self.sent_chars + len(delta)
        first = len(self.starts) - len(self.pending)
        count = len(self.pending) if finish_reason is not None else \
            sum(1 for start in self.starts[first:] if start < released_end)
        logprobs = None
        if self.logprobs is not None:
            released = self.pending[:count]
            logprobs = logprobs_object([t for t, _, _ in released], [lp for _, lp, _ in released],
                                       [top for _, _, top in released] if self.logprobs else None,
                                       [self.prompt_chars + start for start in self.starts[first:first + count]])
        self.pending = self.pending[count:]
        self.sent_chars = released_end
        return {"index": self.index, "text": delta, "logprobs": logprobs, "finish_reason": finish_reason}


def stream_completion(completer, request, prompts: list[list[int]], send) -> None:
    """Generate `request` (a parsed CompletionRequest with stream; `prompts` its checked token ids), calling
    send(chunk) for each chunk as its text becomes final; the caller writes the stream's end."""
    rows = [prompt for prompt in prompts for _ in range(request.n)]
    choices = [ChoiceStream(completer, prompt, row, request.stop, request.logprobs) for row, prompt in enumerate(rows)]
    header = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
              "model": completer.service.name}
    eod = completer.tokenizer.eod

    def emit(chunks):
        for chunk in chunks:
            send({**header, "choices": [chunk]})

    def on_step(tokens, scores) -> bool:
        for row, token in enumerate(tokens):
            choice = choices[row]
            if token is None or choice.finish_reason is not None:
                continue
            emit(choice.add(token, eod, scores.logprobs[row] if scores else None,
                            scores.top[row] if scores and scores.top is not None else None))
        return all(c.finish_reason is not None for c in choices)

    sampling = SamplingParams(greedy=request.temperature == 0, temperature=request.temperature, top_p=request.top_p)
    with completer.service.generating():
        generate(completer.model, rows, request.max_tokens, sampling, eod=eod, seed=request_seed(request.seed),
                 vocab_limit=completer.tokenizer.vocab_size, return_logprobs=request.logprobs is not None,
                 top=request.logprobs or 0, on_step=completer.service.stoppable(on_step))
    for choice in choices:
        if choice.finish_reason is None:
            emit(choice.finish("length"))
