"""Selective activation recomputation (Megatron's --recompute-granularity selective): a memory policy.

`ZayaModel.set_recompute("selective")` sets `recompute_selective` on the modules that declare it; in a
training forward (grad enabled) they then keep less for the backward and compute the rest again there.
The math does not change: losses and gradients are bit-identical (tests/model/test_recompute.py).
In the default pieces no matmul or convolution runs twice; the one exception is the attention core, and
only where SDPA takes its math path (which keeps the S x S probabilities); the "moe" piece (below) reruns
whole MoE sublayers. What goes, and what is kept instead (the planner,
planner/activations.py, counts the same terms by `Term.recomputed_by` / `Term.kept_by`):

* Nothing for the RMSNorms and residual merges ("layernorm"): on both kernel paths they keep only their
  inputs and a per-row rstd (kernels/reference.py's autograd functions, the Triton kernels).
* CCA's QK-norm factors and RoPE's casts of cos/sin: `normalize_and_rotate` runs again from q and k
  (and the fp32 cos/sin tables every layer shares).
* The attention core's S x S probabilities and its fp32 copies of q, k, v, where SDPA takes its math
  path: the core runs again from q, k, v. Flash and memory-efficient SDPA keep no scores (only q, k, v,
  the output and a log-sum-exp): rerunning them would cost an attention forward for nothing, so they
  are left alone (`sdpa_keeps_scores` asks SDPA's own backend choice).
* With packed documents, the PyTorch segmented convolution's shifted input and grouped-conv taps: it
  keeps only its input and the shared visibility, and runs again (elementwise work and a small grouped
  contraction per tap). The fused Triton one (GPUs) keeps only those anyway.
* The router's GELU outputs (the inputs of fc2 and out_proj) and the experts' SwiGLU output (the input
  of the down projection; Megatron's "moe_act"): `feed` computes them again from the activation's input
  just before the matmul's backward reads them; the reference SwiGLU's SiLU output goes too.

None of these pieces holds a collective or draws random numbers, so where they run again does not
matter to CP, TP or EP. Selective and full recomputation are not combined (Megatron's rule too).

Megatron-LM's --recompute-modules chooses among the pieces by its module names (`MODULES`):
"layernorm" (accepted; nothing to recompute, see above), "core_attn" (QK-norm + RoPE, a
math-path attention core and a segmented convolution), "moe_act" (the router's GELU and the experts' SwiGLU outputs) and "moe": the
whole MoE sublayer (router, dispatch, experts, combine) keeps only its inputs and runs again in the
backward, its collectives (EP all-to-all, TP reductions) included, on every rank in the same order.
"moe" is the one piece whose matmuls run twice; with it, "moe_act" has nothing left to drop and is off
(ZayaModel.set_recompute: its hooks would keep what the rerun drops). Without --recompute-modules the three
cheap ones are on (`DEFAULT_MODULES`; Megatron-LM's default is core_attn alone).
"""
from __future__ import annotations

import sys

import torch
import torch.utils.checkpoint
from torch.nn.attention import SDPBackend


MODULES = ("layernorm", "core_attn", "moe_act", "moe")
DEFAULT_MODULES = ("layernorm", "core_attn", "moe_act")
# Megatron-LM's other module names, for parts ZAYA1's blocks do not have.
ABSENT_MODULES = {
    "mlp": "ZAYA1 blocks have no dense MLP (every block's MLP is the MoE layer: --recompute-modules moe)",
    "shared_experts": "ZAYA1's MoE layer has no shared experts",
    "mla_up_proj": "CCA has no MLA up-projection (its QK-norm and RoPE are recomputed under core_attn)",
}


def check_modules(modules) -> tuple[str, ...]:
    """The --recompute-modules names, checked: each one of MODULES (ValueError naming the value)."""
    for name in modules:
        if name in ABSENT_MODULES:
            raise ValueError(f"--recompute-modules {name}: {ABSENT_MODULES[name]}")
        if name not in MODULES:
            raise ValueError(f"--recompute-modules {name}: choose among {', '.join(MODULES)}")
    return tuple(dict.fromkeys(modules))


def selective(module: torch.nn.Module) -> bool:
    """Whether `module` recomputes its cheap pieces in this forward: the policy is on and autograd records."""
    return module.recompute_selective and module.training and torch.is_grad_enabled()


def keep_inputs_only(fn, *args):
    """fn(*args), keeping only args for the backward: whatever fn saves inside is recomputed then
    (non-reentrant checkpoint; fn must not draw random numbers)."""
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False)


def rerun_in_backward(fn, *args):
    """fn(*args), keeping only args: all of fn runs again when the backward reaches it. Early stop is
    off, so the rerun goes to the end on every rank and runs every collective inside fn again, in the
    same order everywhere (a rank whose saved tensors were all recomputed early would skip the rest)."""
    with torch.utils.checkpoint.set_checkpoint_early_stop(False):
        return keep_inputs_only(fn, *args)


class _Recomputed:
    """activation(x), computed again once when a backward first asks for it; laid out as in the forward."""

    def __init__(self, activation, x, out: torch.Tensor):
        self.activation, self.x = activation, x
        self.shape, self.stride = out.shape, out.stride()
        self.value = None

    def get(self) -> torch.Tensor:
        if self.value is None:
            with torch.no_grad():
                value = self.activation(self.x)
            if value.shape != self.shape or value.stride() != self.stride:
                raise RuntimeError("selective recomputation: the activation came back with another layout "
                                   f"({tuple(value.shape)}, {value.stride()} instead of {tuple(self.shape)}, {self.stride})")
            self.value = value
        return self.value


def feed(consumer, activation, x: torch.Tensor, recompute: bool) -> torch.Tensor:
    """consumer(activation(x)). With `recompute`, consumer (a matmul, which saves its input) does not keep
    activation(x) for its backward: the saved input is activation(x) computed again from x when that
    backward unpacks it (activation: elementwise, deterministic, and x kept by its own backward anyway).

    Only the tensors consumer saves pass the saved-tensor hooks set here (an outer pair does not see them)."""
    out = activation(x)
    if not recompute or out.numel() == 0 or not out.requires_grad:
        return consumer(out)
    recipe = _Recomputed(activation, x, out)
    storage, dtype = out.untyped_storage().data_ptr(), out.dtype

    def pack(t):
        if t.dtype == dtype and t.untyped_storage().data_ptr() == storage:   # out itself or a view of it
            return recipe, t.shape, t.stride(), t.storage_offset()
        return t

    def unpack(packed):
        if isinstance(packed, tuple):
            recipe_, shape, stride, offset = packed
            return recipe_.get().as_strided(shape, stride, offset)
        return packed

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        return consumer(out)


def sdpa_keeps_scores(q, k, v, attn_mask, enable_gqa: bool) -> bool:
    """Whether F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=attn_mask is None) takes its math
    path, the one that keeps the S x S probabilities for the backward (SDPA's own choice: the backend flags,
    dtypes, strides and mask; a CausalBias mask as CausalBias itself dispatches, which materialises the
    mask for SDPA when neither fused kernel takes it: a stand-in of the same shape, dtype and last-dim
    stride, one row expanded, is asked about instead of an S x S allocation)."""
    is_causal = attn_mask is None
    # torch.nn.attention.bias imports torch._dynamo (1.5 s of every process's start): not imported here. A
    # CausalBias mask exists only once its module has been imported by whoever made it.
    bias = sys.modules.get("torch.nn.attention.bias")
    if bias is not None and isinstance(attn_mask, bias.CausalBias):
        if attn_mask.seq_len_q == attn_mask.seq_len_kv or attn_mask.variant == bias.CausalVariant.UPPER_LEFT:
            attn_mask, is_causal = None, True
        else:
            from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention
            params = SDPAParams(q, k, v, None, 0.0, False, enable_gqa)
            if can_use_flash_attention(params) or can_use_efficient_attention(params):
                return False
            lq, lk = attn_mask.seq_len_q, attn_mask.seq_len_kv      # CausalBias materialises (Lq, Lk) bool
            attn_mask = torch.ones(lk, dtype=torch.bool, device=q.device).expand(lq, lk)
    try:
        choice = torch._fused_sdp_choice(q, k, v, attn_mask, 0.0, is_causal, enable_gqa=enable_gqa)
    except Exception:       # no kernel at all (SDPA itself will say so), or another torch: recompute, as Megatron does
        return True
    return choice == SDPBackend.MATH.value
