"""The CCA inference cache: what a decode step needs from the tokens before it, per layer.

Per layer and batch row (spec/zaya1.md section 2, "Decode state"):
- K and V after QK-norm, key temperature and RoPE, preallocated for `max_length` slots:
  2 x HKV x dh values per token (ZAYA1-base: 512 per layer, 8x less than 16-head attention);
- the conv context: the last `conv_context` (= 2) time steps of the PRE-convolution packed q0/k0,
  (B, (HQ+HKV)*dh, conv_context), zeros before the first token (the model's left zero padding);
- the delayed value: Wv2 x of the previous token, (B, 1, HKV*dh/2), zeros before the first token.
The router's exponential depth averaging runs across layers within one token, so it needs nothing.

Rows are independent sequences with their own lengths (`lengths`, tokens stored per row): slots
at or beyond a row's length hold stale data that the decode attention masks out.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from megatron_zaya.config import ModelConfig
from megatron_zaya.model.cca import LeftContext


@dataclass
class LayerCache:
    keys: torch.Tensor            # (B, max_length, HKV, dh) post-norm, post-RoPE
    values: torch.Tensor          # (B, max_length, HKV, dh)
    conv_inputs: torch.Tensor     # (B, C, conv_context) last pre-conv packed q0/k0 steps
    delayed_value: torch.Tensor   # (B, 1, HKV*dh/2) previous token's Wv2 x

    def left_context(self, rows) -> LeftContext:
        """The model's LeftContext for `rows` (a slice: views, so updates land in the cache)."""
        return LeftContext(self.conv_inputs[rows], self.delayed_value[rows])


class InferenceCache:
    def __init__(self, config: ModelConfig, batch_size: int, max_length: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        if batch_size < 1 or max_length < 1:
            raise ValueError(f"InferenceCache: batch_size={batch_size} and max_length={max_length} must be >= 1")
        self.config = config
        self.batch_size = batch_size
        self.max_length = max_length
        self.dtype = dtype
        hkv, dh = config.num_query_groups, config.kv_channels
        channels = (config.num_attention_heads + hkv) * dh
        context = config.cca_conv_context
        self.layers = [
            LayerCache(
                keys=torch.zeros(batch_size, max_length, hkv, dh, device=device, dtype=dtype),
                values=torch.zeros(batch_size, max_length, hkv, dh, device=device, dtype=dtype),
                conv_inputs=torch.zeros(batch_size, channels, context, device=device, dtype=dtype),
                delayed_value=torch.zeros(batch_size, 1, hkv * dh // 2, device=device, dtype=dtype),
            )
            for _ in range(config.num_layers)
        ]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)

    def reset(self, rows=slice(None)) -> None:
        """Forget the sequences in `rows`: length 0 and zero conv/value context (K/V slots are masked)."""
        self.lengths[rows] = 0
        for layer in self.layers:
            layer.conv_inputs[rows] = 0
            layer.delayed_value[rows] = 0

    def copy_row(self, source: int, target: int) -> None:
        """Make row `target` hold the same sequence as row `source` (its K/V slots in use, conv and
        value context, length): a prompt prefilled once serves every row that starts with it."""
        length = int(self.lengths[source])
        for layer in self.layers:
            layer.keys[target, :length] = layer.keys[source, :length]
            layer.values[target, :length] = layer.values[source, :length]
            layer.conv_inputs[target] = layer.conv_inputs[source]
            layer.delayed_value[target] = layer.delayed_value[source]
        self.lengths[target] = length

    def reorder(self, index: list[int]) -> None:
        """Row r takes what row index[r] holds (a permutation of the rows)."""
        rows = torch.tensor(index, dtype=torch.long, device=self.lengths.device)
        for layer in self.layers:
            for tensor in (layer.keys, layer.values, layer.conv_inputs, layer.delayed_value):
                tensor.copy_(tensor.index_select(0, rows))
        self.lengths.copy_(self.lengths.index_select(0, rows))

    def bytes_per_token(self) -> int:
        """Cache bytes one more token costs one sequence: K and V of every layer."""
        return sum((layer.keys[0, 0].numel() + layer.values[0, 0].numel()) * layer.keys.element_size()
                   for layer in self.layers)

    def state_bytes_per_sequence(self) -> int:
        """Constant per-sequence decode state: conv context and delayed value of every layer."""
        return sum((layer.conv_inputs[0].numel() + layer.delayed_value[0].numel()) * layer.conv_inputs.element_size()
                   for layer in self.layers)

