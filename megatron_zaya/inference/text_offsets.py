"""Where each token's text starts in a decoded sequence, without decoding every prefix.

OpenAI's `text_offset` of token k is len(decode(ids[:k])). Decoding each prefix is exact but costs
O(n^2) token decodes: about 0.85 s for a 4,000-token request on the benchmark CPU (BENCHMARKS.md), so
some 50 s at 32K, for every scored request. A tokenizer's decode is local: a token's text depends on the few tokens around
it (SentencePiece drops the leading space of the first piece only; byte-level BPE joins the bytes of
one character across neighbouring tokens; Hugging Face decoders may tidy a space before punctuation).
So the prefixes are decoded exactly only at block starts c, every ~sqrt(n) tokens, and inside a
block the growth from c comes from decoding a short window that starts LEFT_CONTEXT tokens before c:

    len(decode(ids[:k])) = len(decode(ids[:c])) + len(decode(ids[a:k])) - len(decode(ids[a:c])),  a = c - 8

This is exact for decoders whose text for a token depends on no more than the LEFT_CONTEXT tokens
before it, which holds for every tokenizer type here. As a guard against others, each block is checked
at its end, where the next block's exact start is known; a block whose window arithmetic misses it is
decoded prefix by prefix instead. O(n^1.5) token decodes in all.

GrowingText applies the same locality to a streamed completion's text, token by token, texts_after
to the text of one token, or of its alternatives, at its place, and token_texts to the texts of all the
tokens of a sequence, which join to its text.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

LEFT_CONTEXT = 8        # tokens decoded before a block's start, so that its first token decodes as in the prefix
EXACT_BELOW = 64        # fewer positions than this: decode each prefix


def prefix_text_lengths(decode: Callable[[Sequence[int]], str], ids: Sequence[int], positions: Iterable[int],
                        block: int | None = None) -> list[int]:
    """[len(decode(ids[:k])) for k in positions], positions ascending in [0, len(ids)]. `block`: the
    tokens between exact prefix decodes (default about sqrt(len(ids)), at least 32)."""
    ids, positions = list(ids), list(positions)
    exact_cache: dict[int, int] = {}

    def exact(k: int) -> int:
        if k not in exact_cache:
            exact_cache[k] = len(decode(ids[:k]))
        return exact_cache[k]

    if len(positions) < EXACT_BELOW and block is None:
        return [exact(k) for k in positions]
    if any(b < a for a, b in zip(positions, positions[1:])) or (positions and not 0 <= positions[0] <= positions[-1] <= len(ids)):
        raise ValueError(f"positions must be ascending in [0, {len(ids)}]")
    block = block or max(32, math.isqrt(len(ids)))
    lengths: list[int] = []
    i = 0
    while i < len(positions):
        start = positions[i] // block * block
        end = min(start + block, len(ids))
        inside = []
        while i < len(positions) and positions[i] < end + (end == len(ids)):
            inside.append(positions[i])
            i += 1
        anchor = max(0, start - LEFT_CONTEXT)
        window_start = len(decode(ids[anchor:start]))

        def by_window(k: int) -> int:
            return exact(start) + len(decode(ids[anchor:k])) - window_start

        if by_window(end) == exact(end):
            lengths += [by_window(k) for k in inside]
        else:                                   # a decoder that is not local here: the exact prefixes
            lengths += [exact(k) for k in inside]
    return lengths


def texts_after(decode: Callable[[Sequence[int]], str], context: Sequence[int], tokens: Iterable[int]) -> list[str]:
    """The text each of `tokens` adds after `context` (its last LEFT_CONTEXT tokens decoded once):
    decode(context + [t]) minus decode(context), so a piece keeps the leading space that decode([t]) drops
    (SentencePiece) and a token reads as it does in the text."""
    left = list(context)[-LEFT_CONTEXT:]
    before = decode(left) if left else ""
    texts = []
    for token in tokens:
        after = decode(left + [token])
        texts.append(after[len(before):] if after.startswith(before) else decode([token]))
    return texts


def token_texts(decode: Callable[[Sequence[int]], str], ids: Sequence[int]) -> list[str]:
    """The text of each of `ids` where it stands: decode(ids) cut where each prefix's text ends (OpenAI's
    text_offset, prefix_text_lengths), so that the texts join to decode(ids) whatever it holds (U+FFFD that
    stays in the text included). A prefix that ends inside a character split over byte tokens decodes with
    U+FFFD for its bytes (one per byte for SentencePiece's byte fallback, one per sequence for Python's
    decoder): those are not the text's, so the character is the text of the last of its tokens, the others
    ''. How long that U+FFFD run is comes from the prefix's last tokens, decoded alone."""
    ids = list(ids)
    text = decode(ids)
    texts, start = [], 0
    for k, length in enumerate(prefix_text_lengths(decode, ids, range(1, len(ids) + 1)), 1):
        end = min(length, len(text))
        tail = decode(ids[max(0, k - LEFT_CONTEXT):k])
        run = len(tail) - len(tail.rstrip("\ufffd"))
        if k > LEFT_CONTEXT:              # (the window's first character may be a cut one's U+FFFD)
            run = min(run, len(tail) - 1)
        for i in range(max(0, end - run), end):
            if text[i] != "\ufffd":       # the first byte of the run that the text does not hold
                end = i
                break
        end = max(end, start)
        texts.append(text[start:end])
        start = end
    if texts:
        texts[-1] += text[start:]
    return texts


FREEZE_BLOCK = 64       # tokens a GrowingText keeps decoding behind its last token


class GrowingText:
    """The text of a growing token sequence that follows a fixed context (e.g. a completion after its
    prompt), as decode(context + tokens) minus the context's text, updated per added token by decoding
    a bounded window: with decoding every token sequence anew, a streamed n-token completion costs
    O(n^2) token decodes. By the same locality as prefix_text_lengths, the text before the last
    FREEZE_BLOCK to 2 FREEZE_BLOCK tokens is frozen and the rest decoded after LEFT_CONTEXT tokens of
    context. A freeze is checked when made: the frozen text plus the window after it must give the text
    as decoded before (which a character split over the boundary fails, U+FFFD against the character);
    if not, the boundary is tried again some tokens later."""

    def __init__(self, decode: Callable[[Sequence[int]], str], context: Sequence[int]):
        self.decode = decode
        self.context = list(context)[-LEFT_CONTEXT:]
        self.tokens: list[int] = []
        self.frozen_tokens = 0           # tokens whose text is frozen_text, for good
        self.frozen_text = ""
        self.next_freeze = 2 * FREEZE_BLOCK
        self.text = ""

    def _window(self, start: int, stop: int | None = None) -> str:
        """The text of tokens[start:stop] where it stands after everything before start."""
        from_context = LEFT_CONTEXT - min(start, LEFT_CONTEXT)   # left context tokens still in the prompt
        left = self.context[-from_context:] if from_context else []
        left = left + self.tokens[start + from_context - LEFT_CONTEXT:start]
        body = self.tokens[start:stop]
        left_text, text = self.decode(left), self.decode(left + body)
        return text[len(left_text):] if text.startswith(left_text) else self.decode(body)

    def append(self, token: int) -> str:
        """Add a token; returns the text of all tokens so far."""
        self.tokens.append(token)
        self.text = self.frozen_text + self._window(self.frozen_tokens)
        if len(self.tokens) >= self.next_freeze:
            self._freeze(len(self.tokens) - FREEZE_BLOCK)
        return self.text

    def _freeze(self, cut: int) -> None:
        head = self.frozen_text + self._window(self.frozen_tokens, cut)
        if head + self._window(cut) == self.text:
            self.frozen_tokens, self.frozen_text = cut, head
            self.next_freeze = cut + 2 * FREEZE_BLOCK
        else:                                    # not a clean boundary: try again later
            self.next_freeze = len(self.tokens) + FREEZE_BLOCK // 4
