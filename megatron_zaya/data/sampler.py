"""Data-parallel batch sampler that resumes exactly at `consumed_samples` (Megatron semantics).

Global sample ids are walked in order from `consumed_samples`; every group of
`micro_batch_size * dp_size` consecutive ids is one micro-batch step across ranks, and rank r gets
ids [r * mbs, (r + 1) * mbs) of the group. A global batch of `gbs` samples is `gbs / (mbs * dp)`
consecutive groups, so after `k` iterations `consumed_samples = k * gbs` and a restarted run with
that value yields exactly the batches an uninterrupted run would have yielded next (also under a
batch-size ramp-up, since only the sample count matters). Incomplete final groups are dropped.
"""

from __future__ import annotations


class PretrainingBatchSampler:
    def __init__(self, total_samples: int, consumed_samples: int, micro_batch_size: int,
                 data_parallel_rank: int, data_parallel_size: int, drop_last: bool = True):
        if total_samples <= 0:
            raise ValueError(f"no samples to draw from (total_samples={total_samples})")
        if micro_batch_size <= 0:
            raise ValueError(f"--micro-batch-size must be positive, got {micro_batch_size}")
        if data_parallel_size <= 0 or not 0 <= data_parallel_rank < data_parallel_size:
            raise ValueError(f"data-parallel rank {data_parallel_rank} is not in [0, {data_parallel_size})")
        if not 0 <= consumed_samples <= total_samples:
            raise ValueError(f"consumed_samples {consumed_samples} is outside [0, {total_samples}] (the dataset size)")
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.rank = data_parallel_rank
        self.size = data_parallel_size
        self.drop_last = drop_last
        self.group = micro_batch_size * data_parallel_size

    def __len__(self) -> int:
        remaining = self.total_samples - self.consumed_samples
        return remaining // self.group if self.drop_last else -(-remaining // self.group)

    def __iter__(self):
        lo = self.rank * self.micro_batch_size
        start = self.consumed_samples
        while start + self.group <= self.total_samples:
            yield list(range(start + lo, start + lo + self.micro_batch_size))
            start += self.group
        if not self.drop_last and start < self.total_samples:
            # Final partial group: each rank takes its micro-batch slot of what is left (as Megatron).
            rest = list(range(start, self.total_samples))
            part = rest[lo:lo + self.micro_batch_size]
            if part:
                yield part
