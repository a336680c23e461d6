"""--mock-data (Megatron-LM's flag): GPT samples of random token ids, no files and no index build.

For trying a model, a layout or a machine before there is a corpus, and for benchmarks. Sample i of
split s is a function of (seed, s, i) only, so every rank, worker and resumed run sees the same
sample at the same index. Each sample holds documents of random length (mean 256 tokens) ending in
EOD, so --reset-position-ids, --reset-attention-mask and --eod-mask-loss behave as on real data.
Random tokens carry nothing to learn: the loss stays near log(vocab).
"""
from __future__ import annotations

import numpy as np

from .gpt_dataset import SampleOptions, gpt_sample

MEAN_DOCUMENT_TOKENS = 256


class MockGPTDataset:
    def __init__(self, num_samples: int, opts: SampleOptions, vocab_size: int, seed: int, split_id: int):
        if vocab_size < 2:
            raise ValueError(f"--mock-data needs a vocabulary of at least 2 tokens, the tokenizer has {vocab_size}")
        self.num_samples, self.opts, self.vocab_size = num_samples, opts, vocab_size
        self.seed, self.split_id = seed, split_id

    def __len__(self) -> int:
        return self.num_samples

    def text(self, idx: int) -> np.ndarray:
        """The seq_length + 1 token ids of sample `idx`."""
        if not 0 <= idx < self.num_samples:
            raise IndexError(f"mock sample {idx} of {self.num_samples}")
        rng = np.random.default_rng((self.seed, self.split_id, idx))
        text = rng.integers(0, self.vocab_size, self.opts.seq_length + 1, dtype=np.int64)
        text[text == self.opts.eod] = (self.opts.eod + 1) % self.vocab_size     # EOD only at document ends
        text[rng.random(text.shape[0]) < 1.0 / MEAN_DOCUMENT_TOKENS] = self.opts.eod
        return text

    def __getitem__(self, idx: int) -> dict[str, np.ndarray]:
        return gpt_sample(self.text(idx), self.opts)
