"""Model configuration: one dataclass with Megatron-named fields, named presets, validation.

Every module of the model receives this object; nothing reads global state.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from megatron_zaya.errors import UserInputError


class ConfigError(UserInputError):
    """A configuration value is invalid; the message names the flag and the value."""


@dataclass
class ModelConfig:
    # Transformer shape (Megatron flag names, without the leading dashes).
    num_layers: int = 40
    hidden_size: int = 2048
    num_attention_heads: int = 8          # HQ: query heads in the compressed space
    num_query_groups: int = 2             # HKV: key/value heads
    kv_channels: int = 128                # dh: head dim
    vocab_size: int = 262272              # padded vocabulary (embedding rows)
    make_vocab_size_divisible_by: int = 128
    seq_length: int = 4096
    max_position_embeddings: int = 131072
    rotary_base: float = 10000.0
    rotary_percent: float = 0.5           # partial RoPE: fraction of each head's channels rotated
    norm_epsilon: float = 1e-5
    untie_embeddings_and_output_weights: bool = False
    # CCA convolutions: kernel sizes of the depthwise then grouped causal conv.
    cca_depthwise_kernel: int = 2
    cca_grouped_kernel: int = 2
    # Mixture of experts (ZAYA1 router).
    num_experts: int = 16
    moe_ffn_hidden_size: int = 2048
    moe_router_topk: int = 1
    router_hidden_size: int = 256
    skip_class_bias_init: float = -1.0    # balancing bias of the skip class at init
    # Initialisation (the policy and why: the docstring of megatron_zaya/model/zaya.py).
    init_method_std: float = 0.02
    embedding_init_method_std: float | None = None   # Megatron's: the embedding's own std (and no weight decay on it)
    key_temperature_init: float = 1.0

    @property
    def rotary_dim(self) -> int:
        return int(self.kv_channels * self.rotary_percent)

    @property
    def cca_conv_context(self) -> int:
        """Steps before a token that CCA's depthwise-then-grouped convolution pair reads."""
        return self.cca_depthwise_kernel - 1 + self.cca_grouped_kernel - 1

    @property
    def cca_lookback(self) -> int:
        """Steps before a token that CCA reads at all: the convolutions' context, and at least the value
        shift's one step (kernels of 1 and 1 convolve nothing back). A mask's lags, a CP halo's width."""
        return max(self.cca_conv_context, 1)

    @property
    def num_router_classes(self) -> int:
        """Experts plus the skip class."""
        return self.num_experts + 1

    def validate(self) -> "ModelConfig":
        def need(cond: bool, flag: str, msg: str) -> None:
            if not cond:
                raise ConfigError(f"--{flag.replace('_', '-')}={getattr(self, flag)}: {msg}")

        for name in ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
                     "vocab_size", "num_experts", "moe_ffn_hidden_size", "router_hidden_size", "seq_length",
                     "make_vocab_size_divisible_by", "norm_epsilon", "rotary_base"):
            need(getattr(self, name) > 0, name, "must be positive")
        for name, value in dataclasses.asdict(self).items():
            need(not isinstance(value, float) or math.isfinite(value), name, "must be a finite number")
        need(self.init_method_std >= 0, "init_method_std", "must be >= 0")
        need(self.embedding_init_method_std is None or self.embedding_init_method_std >= 0,
             "embedding_init_method_std", "must be >= 0")
        need(self.num_attention_heads % self.num_query_groups == 0, "num_attention_heads",
             f"query heads must be divisible by --num-query-groups={self.num_query_groups}")
        need(self.vocab_size % self.make_vocab_size_divisible_by == 0, "vocab_size",
             f"must be a multiple of --make-vocab-size-divisible-by={self.make_vocab_size_divisible_by} "
             f"(next valid: {pad_vocab_size(self.vocab_size, self.make_vocab_size_divisible_by)}); it is the model's "
             f"padded vocabulary: without it, the tokenizer's is padded")
        need(self.moe_router_topk == 1, "moe_router_topk", "the ZAYA1 router is top-1")
        need(0 < self.rotary_percent <= 1, "rotary_percent", "must be in (0, 1]")
        need(self.rotary_dim % 2 == 0, "rotary_percent",
             f"rotary dims kv_channels*rotary_percent={self.rotary_dim} must be even")
        need(self.num_query_groups * self.kv_channels % 2 == 0, "kv_channels",
             "value shift splits the value channels in two halves: num_query_groups*kv_channels must be even")
        need(self.cca_depthwise_kernel >= 1 and self.cca_grouped_kernel >= 1, "cca_depthwise_kernel",
             "conv kernels must be >= 1")
        need(self.max_position_embeddings >= self.seq_length, "max_position_embeddings",
             f"must be >= --seq-length={self.seq_length}")
        return self

    def replace(self, **changes) -> "ModelConfig":
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown model config field(s): {sorted(unknown)}")
        return dataclasses.replace(self, **changes).validate()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def pad_vocab_size(vocab_size: int, multiple: int) -> int:
    """Smallest multiple of `multiple` that holds `vocab_size` tokens (Megatron's vocab padding)."""
    return -(-vocab_size // multiple) * multiple


PRESETS: dict[str, dict] = {
    # The published ZAYA1-base configuration (spec/zaya1.md section 1).
    "zaya1-base": {},
    # For CPU work: ~3M parameters, a training step well under a second on 2 cores.
    "zaya1-tiny": dict(num_layers=4, hidden_size=128, num_attention_heads=4, num_query_groups=2, kv_channels=32,
                       vocab_size=8192, seq_length=256, num_experts=4, moe_ffn_hidden_size=256,
                       router_hidden_size=32, max_position_embeddings=4096),
    # ~100M parameters (~25M active): the CPU benchmark size.
    "zaya1-100m": dict(num_layers=8, hidden_size=512, num_attention_heads=8, num_query_groups=2, kv_channels=64,
                       vocab_size=32768, seq_length=512, num_experts=8, moe_ffn_hidden_size=768,
                       router_hidden_size=128, max_position_embeddings=8192),
    # ZAYA1-base shapes with 4 blocks: fits one GPU with room, for kernel and throughput checks.
    "zaya1-base-4l": dict(num_layers=4),
}


def model_config_from_preset(name: str, **overrides) -> ModelConfig:
    if name not in PRESETS:
        raise ConfigError(f"--preset={name}: unknown preset; choose one of {sorted(PRESETS)}")
    return ModelConfig(**PRESETS[name]).replace(**overrides)
