"""Answer-preserving trimming of long reasoning samples (ZAYA1 recipe, spec section 5).

A sample is text in which reasoning blocks are delimited by an open and a close marker, e.g.
`Q ... <think> long chain of thought </think> answer`. Everything outside the blocks (prompts,
answers) is kept verbatim. When the tokenized sample (plus EOD if appended) exceeds `max_length`:

1. `trimmed_last_reasoning`: cut the tail of the LAST reasoning block (markers and answers kept);
2. `dropped_earlier_reasoning`: if that is not enough, remove earlier reasoning blocks entirely and
   cut the last block's tail to what fits;
3. `answers_only`: if no reasoning token fits, remove all reasoning blocks;
4. `dropped`: if the answers alone do not fit, drop the sample.
Samples that fit are `fit`; too-long samples without any reasoning block are `dropped`.

The final tokens are always the tokenizer's encoding of the final text, so a trimmed sample is
tokenized exactly as if it had been written that way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

OUTCOMES = ("fit", "trimmed_last_reasoning", "dropped_earlier_reasoning", "answers_only", "dropped")


@dataclass
class Segment:
    text: str
    reasoning: bool  # True: the content between the markers (markers are separate plain segments)


def split_reasoning(text: str, open_marker: str, close_marker: str) -> list[Segment]:
    """Split text into plain and reasoning segments. An unclosed block runs to the end of the text."""
    segs: list[Segment] = []
    pos = 0
    while True:
        a = text.find(open_marker, pos)
        if a < 0:
            break
        b = text.find(close_marker, a + len(open_marker))
        segs.append(Segment(text[pos:a + len(open_marker)], False))
        if b < 0:
            segs.append(Segment(text[a + len(open_marker):], True))
            pos = len(text)
            break
        segs.append(Segment(text[a + len(open_marker):b], True))
        pos = b
    segs.append(Segment(text[pos:], False))
    return segs


def _join(segs: Sequence[Segment]) -> str:
    return "".join(s.text for s in segs)


class ReasoningTrimmer:
    """Applies the trimming recipe with a tokenizer's `encode`/`decode`."""

    def __init__(self, encode: Callable[[str], list[int]], decode: Callable[[Sequence[int]], str],
                 max_length: int, open_marker: str = "<think>", close_marker: str = "</think>",
                 extra_tokens: int = 0):
        if max_length <= 0:
            raise ValueError(f"--trim-max-length must be positive, got {max_length}")
        if not open_marker or not close_marker:
            raise ValueError("--reasoning-markers needs a non-empty open and close marker")
        self.encode, self.decode = encode, decode
        self.budget = max_length - extra_tokens  # room for the text's tokens (EOD excluded)
        self.open_marker, self.close_marker = open_marker, close_marker

    def _fit_last_block(self, segs: list[Segment], last: int) -> list[int] | None:
        """Cut the tail of reasoning segment `last` until the whole sample fits; None if even an
        empty block does not fit or nothing of the block can be kept."""
        content = segs[last].text
        lead = content[: len(content) - len(content.lstrip())]
        trail = content[len(content.rstrip()):] if content.strip() else ""
        content_ids = self.encode(content)
        keep = len(content_ids)
        for _ in range(8):  # token-boundary effects are small; converge in a few rounds
            trial = list(segs)
            trial[last] = Segment(lead + self.decode(content_ids[:keep]).strip() + trail if keep else lead, True)
            ids = self.encode(_join(trial))
            over = len(ids) - self.budget
            if over <= 0:
                return ids if keep > 0 else None
            keep -= over
            if keep <= 0:
                return None
        return None

    def __call__(self, text: str, ids: list[int] | None = None) -> tuple[list[int] | None, str]:
        """Return (token ids or None if dropped, outcome)."""
        if ids is None:
            ids = self.encode(text)
        if len(ids) <= self.budget:
            return ids, "fit"
        segs = split_reasoning(text, self.open_marker, self.close_marker)
        blocks = [i for i, s in enumerate(segs) if s.reasoning]
        if not blocks:
            return None, "dropped"
        last = blocks[-1]
        out = self._fit_last_block(segs, last)
        if out is not None:
            return out, "trimmed_last_reasoning"
        if len(blocks) > 1:
            # Remove earlier blocks with their markers: the plain text before each block ends with the
            # open marker and the text after it starts with the close marker.
            work = list(segs)
            pruned: list[Segment] = []
            i = 0
            while i < len(work):
                s = work[i]
                if s.reasoning and i != last:
                    prev = pruned[-1]
                    pruned[-1] = Segment(prev.text[: len(prev.text) - len(self.open_marker)], False)
                    nxt = work[i + 1]
                    work[i + 1] = Segment(nxt.text[len(self.close_marker):], False)
                else:
                    pruned.append(s)
                i += 1
            new_last = max(i for i, s in enumerate(pruned) if s.reasoning)
            out = self._fit_last_block(pruned, new_last)
            if out is not None:
                return out, "dropped_earlier_reasoning"
        answers = []
        for i, s in enumerate(segs):
            if s.reasoning:
                continue
            t = s.text
            if i + 1 < len(segs) and segs[i + 1].reasoning and t.endswith(self.open_marker):
                t = t[: len(t) - len(self.open_marker)]
            if i > 0 and segs[i - 1].reasoning and t.startswith(self.close_marker):
                t = t[len(self.close_marker):]
            answers.append(t)
        ids = self.encode("".join(answers))
        if ids and len(ids) <= self.budget:
            return ids, "answers_only"
        return None, "dropped"
