"""Parallel layout settings, with Megatron's flag names (data parallel size = world / the others)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ParallelConfig:
    tensor_model_parallel_size: int = 1     # --tensor-model-parallel-size
    context_parallel_size: int = 1          # --context-parallel-size
    expert_model_parallel_size: int = 1     # --expert-model-parallel-size
    sequence_parallel: bool = False         # --sequence-parallel (needs TP > 1)
    use_distributed_optimizer: bool = False  # --use-distributed-optimizer (ZeRO-1)
    ddp_bucket_size: int = 40_000_000       # --ddp-bucket-size, in elements per gradient bucket (reduction
                                            # always overlaps the backward: there is no --overlap-grad-reduce)

    def validate(self) -> "ParallelConfig":
        for name in ("tensor_model_parallel_size", "context_parallel_size", "expert_model_parallel_size",
                     "ddp_bucket_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')}={getattr(self, name)}: must be >= 1")
        if self.sequence_parallel and self.tensor_model_parallel_size == 1:
            raise ValueError("--sequence-parallel needs --tensor-model-parallel-size > 1")
        return self
