"""Low-precision copies of fp32 weights made once per optimizer step instead of once per micro-batch.

Under bf16 autocast every micro-batch's forward casts the fp32 weights it multiplies. The experts'
stacked weights and the LM head, nine tenths of zaya1-100m's weights, are cast by the model itself
(experts.grouped_matmul, ZayaModel.head_and_loss) through a `WeightCasts`. Inside `caching()` (the
trainer's loop over one step's micro-batches) the first micro-batch's copy of each weight is kept and
the later ones reuse it. A reused copy still passes each micro-batch's gradient to the fp32 weight:
the cast's autograd node holds no tensors, so every backward pass can run through it. A copy is reused
only while its weight is unchanged (the tensor's version counter) and in the same autograd mode; all
are dropped when the loop ends.

The trainer caches on CPU only, where a cast is a sizeable pass over memory (2% of a zaya1-100m step:
`bench/train_throughput.py --weight-casts-ab`, BENCHMARKS.md), and not under full recomputation, where
the kept copies would outlive the blocks that hold them only while they run (the planner's memory). On
a GPU a cast is a small fraction of a step. Without full recomputation a micro-batch holds every copy
for its backward anyway, so keeping them adds no peak memory.
"""
from __future__ import annotations

import contextlib

import torch


class WeightCasts:
    """weight -> weight in `dtype`: a fresh cast, or inside `caching()` this step's kept copy."""

    def __init__(self):
        self._copies: dict[tuple[int, torch.dtype], tuple] | None = None

    def __call__(self, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if weight.dtype == dtype:
            return weight
        if self._copies is None:
            return weight.to(dtype)
        key, grad_mode = (id(weight), dtype), torch.is_grad_enabled()
        kept = self._copies.get(key)
        if kept is not None and kept[0] is weight and kept[1] == weight._version and kept[2] == grad_mode:
            return kept[3]
        copy = weight.to(dtype)
        self._copies[key] = (weight, weight._version, grad_mode, copy)
        return copy

    @property
    def caching_now(self) -> bool:
        return self._copies is not None

    @property
    def kept(self) -> int:
        """How many copies are kept now (0 outside `caching()`)."""
        return len(self._copies or ())

    @contextlib.contextmanager
    def caching(self, enabled: bool = True):
        """Keep the copies made inside this context and reuse them; drop them at its end."""
        if not enabled or self.caching_now:       # nested: the outer context owns the copies
            yield
            return
        self._copies = {}
        try:
            yield
        finally:
            self._copies = None
