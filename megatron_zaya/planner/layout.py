"""The parallel layout the planner evaluates: TP x CP x DP = GPUs, EP carved out of DP x CP."""
from __future__ import annotations

from dataclasses import dataclass

from megatron_zaya.config import ModelConfig
from megatron_zaya.errors import UserInputError
from megatron_zaya.model.recompute import check_modules

RECOMPUTE_CHOICES = ("none", "selective", "full")


class LayoutError(UserInputError):
    """The layout is impossible; the message names the flag and the value."""


def tp_rank_config(config: ModelConfig, tensor_parallel: int) -> ModelConfig:
    """The model as one TP rank holds it, TP ways: with more TP ranks than KV heads each rank holds a whole
    KV head, replicated (parallel/tensor.py), as if the model had TP KV heads split TP ways. The planner
    counts a rank's attention weights, activations, K/V traffic and work with it."""
    if tensor_parallel <= config.num_query_groups:
        return config
    return config.replace(num_query_groups=tensor_parallel)


@dataclass(frozen=True)
class ParallelLayout:
    gpus: int
    seq_length: int
    micro_batch_size: int
    global_batch_size: int
    tensor_parallel: int = 1
    context_parallel: int = 1
    expert_parallel: int = 1
    zero1: bool = False                   # --use-distributed-optimizer
    recompute: str = "none"               # none | selective | full
    recompute_modules: tuple[str, ...] = ()   # with selective: Megatron's --recompute-modules names (() = default)
    sequence_parallel: bool = False       # --sequence-parallel (with TP > 1)

    @property
    def recompute_text(self) -> str:
        """'selective (layernorm moe)', or the policy alone."""
        return f"{self.recompute} ({' '.join(self.recompute_modules)})" if self.recompute_modules else self.recompute

    @property
    def tp_text(self) -> str:
        """'2 (sequence parallel)', or the TP size alone."""
        sp = self.sequence_parallel and self.tensor_parallel > 1
        return f"{self.tensor_parallel}{' (sequence parallel)' if sp else ''}"

    @property
    def recomputes_moe(self) -> bool:
        """Whether every MoE sublayer runs again in the backward (--recompute-modules moe)."""
        return self.recompute == "selective" and "moe" in self.recompute_modules

    @property
    def data_parallel(self) -> int:
        return self.gpus // (self.tensor_parallel * self.context_parallel)

    @property
    def dense_shard_group(self) -> int:
        """Ranks over which dense gradients are reduced and ZeRO-1 shards: DP x CP (they hold different data)."""
        return self.data_parallel * self.context_parallel

    @property
    def expert_data_parallel(self) -> int:
        """Ranks holding the same experts: DP x CP / EP."""
        return self.dense_shard_group // self.expert_parallel

    @property
    def micro_batches(self) -> int:
        """Gradient-accumulation steps per optimizer step."""
        return self.global_batch_size // (self.micro_batch_size * self.data_parallel)

    @property
    def local_tokens(self) -> int:
        """Tokens one GPU holds in one micro-batch (before TP)."""
        return self.micro_batch_size * self.seq_length // self.context_parallel

    def validate(self, config: ModelConfig) -> "ParallelLayout":
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise LayoutError(msg)

        for flag, value in (("--gpus", self.gpus), ("--seq-length", self.seq_length),
                            ("--micro-batch-size", self.micro_batch_size),
                            ("--global-batch-size", self.global_batch_size),
                            ("--tensor-model-parallel-size", self.tensor_parallel),
                            ("--context-parallel-size", self.context_parallel),
                            ("--expert-model-parallel-size", self.expert_parallel)):
            need(value >= 1, f"{flag}={value}: must be >= 1")
        tp, cp, ep = self.tensor_parallel, self.context_parallel, self.expert_parallel
        need(self.gpus % (tp * cp) == 0,
             f"--gpus={self.gpus}: must be a multiple of --tensor-model-parallel-size x --context-parallel-size = {tp * cp}")
        need(self.recompute in RECOMPUTE_CHOICES, f"--recompute={self.recompute}: choose one of {RECOMPUTE_CHOICES}")
        need(not self.recompute_modules or self.recompute == "selective",
             f"--recompute-modules goes with --recompute selective, not {self.recompute}")
        try:
            check_modules(self.recompute_modules)
        except ValueError as err:
            raise LayoutError(str(err)) from None
        hkv = config.num_query_groups
        need(config.num_attention_heads % tp == 0 and (hkv % tp == 0 or tp % hkv == 0),
             f"--tensor-model-parallel-size={tp}: must divide the query heads ({config.num_attention_heads}) "
             f"and divide or be a multiple of the KV heads ({hkv}; replicated when TP > KV heads)")
        need(config.moe_ffn_hidden_size % tp == 0 and config.vocab_size % tp == 0,
             f"--tensor-model-parallel-size={tp}: must divide --moe-ffn-hidden-size={config.moe_ffn_hidden_size} "
             f"and the vocabulary ({config.vocab_size})")
        need(self.seq_length % (2 * cp) == 0 or cp == 1,
             f"--context-parallel-size={cp}: --seq-length={self.seq_length} must be a multiple of 2 x CP "
             "(load-balanced causal chunks)")
        need(config.num_experts % ep == 0,
             f"--expert-model-parallel-size={ep}: must divide --num-experts={config.num_experts}")
        need(self.dense_shard_group % ep == 0,
             f"--expert-model-parallel-size={ep}: must divide DP x CP = {self.dense_shard_group}")
        need(self.global_batch_size % (self.micro_batch_size * self.data_parallel) == 0,
             f"--global-batch-size={self.global_batch_size}: must be a multiple of --micro-batch-size x DP = "
             f"{self.micro_batch_size} x {self.data_parallel}")
        need(self.seq_length <= config.max_position_embeddings,
             f"--seq-length={self.seq_length}: exceeds --max-position-embeddings={config.max_position_embeddings}")
        return self
