"""Deterministic pseudo-English text for tests and benchmarks (no downloads needed).

Words are drawn from a fixed synthetic lexicon with a Zipf-like frequency law, grouped into
sentences and paragraphs, so tokenizers see realistic repetition statistics.
"""

from __future__ import annotations

import json
import random

_SYLLABLES = (
    "the an re in er on at en es or ti te st ar al le is ou it ha ed nd to of se ing ion ver "
    "com pro con ex per tra ment ly ble na ma pa da ka lo mo ro so wi"
).split()


def make_lexicon(size: int = 5000, seed: int = 0) -> list[str]:
    """Return `size` distinct pseudo-words built from common English syllables."""
    rng = random.Random(seed)
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < size:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((1, 1, 2, 2, 2, 3, 4))))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


class TextGenerator:
    """Generates documents of pseudo-English with Zipf-distributed words."""

    def __init__(self, seed: int = 0, lexicon_size: int = 5000):
        self.rng = random.Random(seed)
        self.words = make_lexicon(lexicon_size, seed)
        weights = [1.0 / (rank + 1) for rank in range(len(self.words))]
        total = sum(weights)
        acc, cum = 0.0, []
        for w in weights:
            acc += w / total
            cum.append(acc)
        self._cum = cum

    def sentence(self) -> str:
        n = self.rng.randint(4, 18)
        words = self.rng.choices(self.words, cum_weights=self._cum, k=n)
        words[0] = words[0].capitalize()
        return " ".join(words) + self.rng.choice((".", ".", ".", "?", "!", ","))

    def document(self, min_sentences: int = 2, max_sentences: int = 40) -> str:
        paragraphs = []
        for _ in range(self.rng.randint(1, 4)):
            k = self.rng.randint(min_sentences, max_sentences)
            paragraphs.append(" ".join(self.sentence() for _ in range(k)))
        return "\n\n".join(paragraphs)


def write_jsonl(path: str, num_docs: int, seed: int = 0, key: str = "text", **doc_kwargs) -> list[str]:
    """Write `num_docs` generated documents as JSONL; returns the documents."""
    gen = TextGenerator(seed)
    docs = [gen.document(**doc_kwargs) for _ in range(num_docs)]
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({key: d}) + "\n")
    return docs
