"""Compressed Convolutional Attention (CCA with grouped KV heads), single device.

Math: spec/zaya1.md section 2 and the transformers reference `ZayaAttention`. Shapes use
B batch, S sequence, HQ query heads, HKV KV heads, dh head dim, C = (HQ + HKV) * dh conv channels.

Context across a boundary (the previous chunk under context parallelism, or the previous tokens
when decoding) enters through `LeftContext`: the last pre-convolution q0/k0 steps and the previous
token's delayed value projection. At the start of a sequence both are zeros, as in the reference.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from megatron_zaya import kernels
from megatron_zaya.config import ModelConfig
from megatron_zaya.kernels import cpu_attention
from megatron_zaya.model import recompute
from megatron_zaya.model.documents import PackedDocuments


@dataclass
class LeftContext:
    conv_inputs: torch.Tensor      # (B, C, conv_context) pre-conv packed q0/k0 of the preceding steps
    delayed_value: torch.Tensor    # (B, 1, HKV*dh/2) Wv2 x of the preceding token
    visible: torch.Tensor | None = None   # (B, conv_context, lags) those steps' own lag visibility (packed
                                          # documents under CP), with a `visible` for the steps themselves


def lag_visibility(attention_mask: torch.Tensor | None, lags: int) -> torch.Tensor | None:
    """(B, S, lags) bool: whether step t may see step t - l, for l = 1 .. lags, read from the
    sub-diagonals of an attention mask (B or 1, 1, S, S), True = attend; False before the first step.
    None without a mask (every earlier step visible: the causal default)."""
    if attention_mask is None:
        return None
    if attention_mask.dtype != torch.bool:
        raise ValueError(f"attention_mask must be boolean (True = attend), got {attention_mask.dtype}")
    mask = attention_mask[:, 0]
    columns = []
    for lag in range(1, lags + 1):
        diagonal = torch.diagonal(mask, offset=-lag, dim1=-2, dim2=-1)          # (B, S - lag): t >= lag
        before = min(lag, mask.shape[-1])                                       # steps with no t - lag
        columns.append(torch.cat((diagonal.new_zeros(diagonal.shape[:-1] + (before,)), diagonal), dim=-1))
    return torch.stack(columns, dim=-1)


def visibility_of(attention_mask, lags: int) -> torch.Tensor | None:
    """The lag visibility for the convolutions and value shift from a (B, 1, S, S) bool mask or
    PackedDocuments (built once per forward); None for the causal default."""
    if isinstance(attention_mask, PackedDocuments):
        return attention_mask.visibility(lags)
    return lag_visibility(attention_mask, lags)


def sdpa_mask(attention_mask, dtype: torch.dtype):
    """What SDPA gets: a dense mask as given, PackedDocuments' shared additive bias in `dtype`, or None."""
    if isinstance(attention_mask, PackedDocuments):
        return attention_mask.attention_bias(dtype)
    return attention_mask


def kv_for_sdpa(q, k, v, mask, groups: int):
    """(k, v, enable_gqa, math) for SDPA on (B, H, S, dh) q, k, v, math: whether SDPA takes its math path
    with them (what selective recomputation asks). The grouped K/V heads go as they are, unless
    SDPA would then take its math path (S x S scores, kept for the backward) and K/V repeated to the
    query heads let it take a fused kernel: on CUDA flash attention takes no explicit mask and the
    memory-efficient kernel no grouped heads (packed documents' bias), and some ROCm builds' flash
    takes no grouped heads at all. SDPA's own choice decides (recompute.sdpa_keeps_scores); on CPU
    the flash kernel takes both, and nothing is repeated."""
    grouped = groups > 1
    math = recompute.sdpa_keeps_scores(q, k, v, mask, grouped)
    if not (grouped and math):
        return k, v, grouped, math
    repeated = tuple(t.repeat_interleave(groups, dim=1) for t in (k, v))
    if recompute.sdpa_keeps_scores(q, *repeated, mask, False):
        return k, v, True, True
    return repeated + (False, False)


class CompressedConvAttention(nn.Module):
    # Memory policy (ZayaModel.set_recompute): QK-norm, RoPE and a math-path attention core recomputed.
    recompute_module = "core_attn"
    recompute_selective = False

    def __init__(self, config: ModelConfig, num_heads: int | None = None, num_kv_heads: int | None = None):
        super().__init__()
        self.num_heads = num_heads or config.num_attention_heads
        self.num_kv_heads = num_kv_heads or config.num_query_groups
        self.head_dim = config.kv_channels
        self.groups = self.num_heads // self.num_kv_heads
        self.rotary_dim = config.rotary_dim
        d, dh = config.hidden_size, self.head_dim
        q_width, kv_width = self.num_heads * dh, self.num_kv_heads * dh
        self.linear_q = nn.Linear(d, q_width, bias=False)
        self.linear_k = nn.Linear(d, kv_width, bias=False)
        self.linear_v_current = nn.Linear(d, kv_width // 2, bias=False)
        self.linear_v_previous = nn.Linear(d, kv_width // 2, bias=False)
        channels = q_width + kv_width
        self.conv_depthwise = nn.Conv1d(channels, channels, config.cca_depthwise_kernel, groups=channels)
        self.conv_grouped = nn.Conv1d(channels, channels, config.cca_grouped_kernel,
                                      groups=self.num_heads + self.num_kv_heads)
        self.conv_context, self.lookback = config.cca_conv_context, config.cca_lookback
        # Learned per-KV-head key temperature, used linearly (logits bounded by sqrt(dh) * |T|).
        self.key_temperature = nn.Parameter(torch.full((self.num_kv_heads,), config.key_temperature_init))
        self.linear_proj = nn.Linear(q_width, d, bias=False)

    def input_projections(self, x: torch.Tensor):
        """x (B, S, D) -> packed [q0 | k0] (B, S, C), v_current and v_delayed (B, S, width of each).
        The four input projections read the same x: one matmul on their stacked weights, then a
        split (the parameters stay separate for checkpoints, export and TP slicing). The widths come
        from the weights: under TP a rank may hold all of v_current and none of v_previous."""
        weights = (self.linear_q.weight, self.linear_k.weight, self.linear_v_current.weight,
                   self.linear_v_previous.weight)
        rows = [w.shape[0] for w in weights]
        return F.linear(x, torch.cat(weights)).split((rows[0] + rows[1], rows[2], rows[3]), dim=-1)

    # -- the three stages, separable so that context parallelism can replace `attend` ------------
    def project(self, x: torch.Tensor, left: LeftContext | None = None, visible: torch.Tensor | None = None):
        """x (B, S, D) -> q (B, S, HQ, dh), k and v (B, S, HKV, dh) before QK-norm and RoPE,
        plus the raw q0/k0 and delayed values (for handing context to the right). `visible`
        (lag_visibility of an attention mask) restarts the convolutions and the value shift where
        the mask does (documents of a packed sequence)."""
        b, s, _ = x.shape
        dh = self.head_dim
        q_width, kv_width = self.num_heads * dh, self.num_kv_heads * dh
        packed, v_current, v_delayed = self.input_projections(x)              # packed = [q0 | k0] (B, S, C)
        # q-k mean from the PRE-convolution projections; query head h pairs with KV head h // groups.
        # (split rather than slices throughout: a split's backward is one cat, a slice's a zero-filled
        # full-size buffer plus a copy and an add per slice.)
        q0, k0 = packed.split((q_width, kv_width), dim=-1)
        q0 = q0.view(b, s, self.num_kv_heads, self.groups, dh)
        k0 = k0.view(b, s, self.num_kv_heads, 1, dh)
        mean_q = (q0 + k0) * 0.5                                               # (B, S, HKV, groups, dh)
        mean_k = mean_q.mean(dim=3)
        mean_q = mean_q.view(b, s, self.num_heads, dh)
        mixed = self.causal_conv(packed, left, visible)                        # (B, S, C)
        # The adds write q and k channel-last and contiguous (the layout of their first operand):
        # the elementwise QK-norm/RoPE passes and SDPA's fused CPU kernel need a unit stride on the
        # head dim (a strided q sends SDPA to its math path, S x S scores included).
        mixed_q, mixed_k = mixed.split((q_width, kv_width), dim=-1)
        q = mean_q + mixed_q.reshape(b, s, self.num_heads, dh)
        k = mean_k + mixed_k.reshape(b, s, self.num_kv_heads, dh)
        # Value shift: half the value channels from this token, half from the previous one.
        v = torch.cat((v_current, self.shift_values(v_delayed, left, visible)), dim=-1)
        return q, k, v.view(b, s, self.num_kv_heads, dh), packed.transpose(1, 2), v_delayed

    @staticmethod
    def shift_values(v_delayed: torch.Tensor, left: LeftContext | None = None,
                     visible: torch.Tensor | None = None) -> torch.Tensor:
        """The delayed value half at step t: step t - 1's (left's before the first step, else zeros;
        zeros where `visible` says step t may not see step t - 1)."""
        if left is None:
            shifted = F.pad(v_delayed, (0, 0, 1, -1))                          # zeros, then rows 0..S-2
        else:
            shifted = torch.cat((left.delayed_value.to(v_delayed.dtype), v_delayed[:, :-1]), dim=1)
        return shifted if visible is None else shifted * visible[..., :1].to(shifted.dtype)

    def causal_conv(self, packed: torch.Tensor, left: LeftContext | None = None,
                    visible: torch.Tensor | None = None) -> torch.Tensor:
        """Causal depthwise then grouped convolution over time on packed q0/k0 (B, S, C) -> (B, S, C),
        through kernels.cca_causal_conv (fused Triton on a GPU; otherwise two convolutions on the module's
        Conv1d weights, run channels-last). Left of the first step: `left`'s inputs, or zeros. With `visible` the
        convolution restarts where it says (kernels.cca_causal_conv_segmented)."""
        weights = (self.conv_depthwise.weight, self.conv_depthwise.bias, self.conv_grouped.weight,
                   self.conv_grouped.bias)
        if visible is not None:
            # Under selective recomputation (core_attn) the segmented conv keeps only its inputs: its
            # shifted input and grouped-conv taps are elementwise work, recomputed in the backward.
            segmented = functools.partial(kernels.cca_causal_conv_segmented, recompute=recompute.selective(self))
            if left is None:
                return segmented(packed, *weights, visible)
            if left.visible is None:
                raise ValueError("a left context with a visibility mask needs the left steps' visibility")
            # The left steps go in front, with their own visibility, and their outputs are dropped.
            width = left.conv_inputs.shape[-1]
            extended = torch.cat((left.conv_inputs.transpose(1, 2).to(packed.dtype), packed), dim=1)
            return segmented(extended, *weights, torch.cat((left.visible, visible), dim=1))[:, width:]
        return kernels.cca_causal_conv(packed, *weights, None if left is None else left.conv_inputs)

    def normalize_and_rotate(self, q, k, cos, sin):
        """QK-norm to length sqrt(dh), linear key temperature, then partial RoPE."""
        if recompute.selective(self):      # elementwise: run again in the backward from q, k (and the tables)
            return recompute.keep_inputs_only(self._normalize_and_rotate, q, k, cos, sin)
        return self._normalize_and_rotate(q, k, cos, sin)

    def _normalize_and_rotate(self, q, k, cos, sin):
        # Length sqrt(dh) per head; the key temperature folds into the keys' per-row factor.
        q, k = kernels.qk_norm(q), kernels.qk_norm(k, self.key_temperature)
        return kernels.apply_partial_rope(q, cos, sin), kernels.apply_partial_rope(k, cos, sin)

    def attend(self, q, k, v, attention_mask: torch.Tensor | None = None):
        """Causal GQA softmax attention; (B, S, H, dh) in, (B, S, HQ*dh) out."""
        return self.attend_prepared(*self.sdpa_inputs(q, k, v, attention_mask), attention_mask)

    def sdpa_inputs(self, q, k, v, attention_mask):
        """(B, S, H, dh) q, k, v -> SDPA's (B, H, S, dh) q, k, v, enable_gqa and whether SDPA takes its math path.
        Grouped KV heads go to SDPA as they are where a fused kernel takes them (torch 2.13's CPU flash kernel,
        CUDA flash without a mask): no repeat_interleave copies of K and V (nor their backward sums). Elsewhere
        they are repeated when only that keeps SDPA off its math path (kv_for_sdpa)."""
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        return (q,) + kv_for_sdpa(q, k, v, attention_mask, self.groups)

    def attend_prepared(self, q, k, v, gqa: bool, math: bool, attention_mask):
        """`attend` on what sdpa_inputs made ((B, H, S, dh) tensors)."""
        def core(q, k, v):
            if attention_mask is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, enable_gqa=gqa)

        # Selective recomputation: SDPA's math path keeps the S x S probabilities; the core then runs again
        # in the backward from q, k, v. Flash and memory-efficient kernels keep no scores: run once.
        # bf16 training on CPU: the flash forward with a faster backward (kernels/cpu_attention.py).
        if cpu_attention.applies(q, k, v, attention_mask):
            out = cpu_attention.causal_attention(q, k, v)
        elif recompute.selective(self) and math:
            out = recompute.keep_inputs_only(core, q, k, v)
        else:
            out = core(q, k, v)
        b, _, s, _ = out.shape
        return out.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim)

    def forward(self, x, cos, sin, attention_mask=None):
        """attention_mask (B, 1, S, S) bool, True = attend, PackedDocuments, or None (causal): where it
        hides a step, the convolutions and the value shift do not read it either (packed documents)."""
        q, k, v, _, _ = self.project(x, visible=visibility_of(attention_mask, self.lookback))
        q, k = self.normalize_and_rotate(q, k, cos, sin)
        return self.linear_proj(self.attend(q, k, v, sdpa_mask(attention_mask, q.dtype)))
