"""Fused ops with one switch: Triton kernels on a GPU, the PyTorch reference elsewhere.

The model and optimizers call the functions exported here; `reference.py` holds the math and is
the single source of truth. Backend selection (see docs/KERNELS.md):

* ``MEGATRON_ZAYA_KERNELS=auto`` (default): Triton when every tensor argument is on a CUDA/ROCm
  device and triton imports; the reference otherwise (CPU tensors, triton missing or broken).
* ``MEGATRON_ZAYA_KERNELS=triton``: always Triton (CPU tensors then need ``TRITON_INTERPRET=1``
  set before the kernel modules are imported); an error if triton cannot be imported.
* ``MEGATRON_ZAYA_KERNELS=torch``: always the reference.

``set_kernel_backend(name)`` changes the switch at run time; ``kernel_backend()`` reads it.
Importing this package never imports triton: kernel modules are imported on first use.
"""
from __future__ import annotations

import importlib
import os
import warnings

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from megatron_zaya.kernels import reference
from megatron_zaya.kernels.reference import NS_COEFFICIENTS, embedding, qk_norm, rotate_half  # noqa: F401
from megatron_zaya.kernels.capability import triton_interpreted

_BACKENDS = ("auto", "triton", "torch")
_backend = "auto"
_modules: dict[str, object] = {}
_import_errors: dict[str, BaseException] = {}


def set_kernel_backend(name: str) -> None:
    """Select "auto", "triton" or "torch" for every op of this package."""
    global _backend
    name = str(name).strip().lower()
    if name not in _BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r}; expected one of {_BACKENDS}")
    _backend = name


def kernel_backend() -> str:
    return _backend


def _backend_from_environment() -> str | None:
    """MEGATRON_ZAYA_KERNELS, the default switch; a value it cannot be: a warning here, and pretrain_zaya.py
    stops on it with one line (`environment_problem`) before any work. (Not a traceback at import.)"""
    try:
        set_kernel_backend(os.environ.get("MEGATRON_ZAYA_KERNELS", "auto") or "auto")
        return None
    except ValueError:
        problem = (f"MEGATRON_ZAYA_KERNELS={os.environ['MEGATRON_ZAYA_KERNELS']!r}: expected one of "
                   f"{', '.join(_BACKENDS)}")
        warnings.warn(f"{problem}; using auto")
        return problem


_environment_problem = _backend_from_environment()


def environment_problem() -> str | None:
    """Why MEGATRON_ZAYA_KERNELS was not taken, or None."""
    return _environment_problem


def _module(name: str):
    """The Triton module `triton_<name>`, or None when triton is missing or fails to import."""
    if name in _modules:
        return _modules[name]
    if name in _import_errors:
        return None
    try:
        mod = importlib.import_module(f"megatron_zaya.kernels.triton_{name}")
    except Exception as exc:  # triton missing, or broken on this machine: fall back to the reference
        _import_errors[name] = exc
        if _backend == "auto" and len(_import_errors) == 1:     # once ("triton" raises instead; "torch" asked)
            warnings.warn(f"megatron_zaya.kernels: Triton {name} unavailable ({exc!r}); using PyTorch for every "
                          f"kernel whose Triton module does not import")
        return None
    _modules[name] = mod
    return mod


# Opt-in on the reference path (CPU): the elementwise reference ops through torch.compile (inductor
# fuses each op's forward and backward into a few C++ loops). Same math; off by default because every
# new shape costs a compilation. MEGATRON_ZAYA_COMPILE=1 or set_reference_compile(True).
_compile_reference = os.environ.get("MEGATRON_ZAYA_COMPILE", "0").strip() not in ("", "0")
_compiled: dict[str, object] = {}
COMPILED_OPS = ("rms_norm", "scaled_residual_add", "scaled_residual_add_rms_norm", "swiglu", "apply_partial_rope",
                "cross_entropy")


def set_reference_compile(enabled: bool) -> None:
    global _compile_reference
    _compile_reference = bool(enabled)


def reference_compiled() -> bool:
    return _compile_reference


def _ref(name: str):
    """reference.<name>, or its torch.compile'd form when the reference compile switch is on."""
    if not _compile_reference or name not in COMPILED_OPS:
        return getattr(reference, name)
    fn = _compiled.get(name)
    if fn is None:
        fn = _compiled[name] = torch.compile(getattr(reference, name))
    return fn


def triton_available(name: str = "rmsnorm") -> bool:
    return _module(name) is not None


def _triton(name: str, *tensors):
    """The Triton module to use for this call, or None for the reference."""
    if _backend == "torch":
        return None
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    if not tensors or any(t.dtype == torch.float64 for t in tensors):
        return None      # nothing to launch on; float64 keeps the reference's precision (the kernels compute fp32)
    on_gpu = all(t.is_cuda for t in tensors)
    if _backend == "auto" and not on_gpu:
        return None
    if not (on_gpu or triton_interpreted()):
        raise RuntimeError(f"MEGATRON_ZAYA_KERNELS=triton with CPU tensors ({name}): Triton "
                           f"compiles for GPUs; on CPU its kernels run only in the interpreter (TRITON_INTERPRET=1)")
    mod = _module(name)
    if mod is None and _backend == "triton":
        raise RuntimeError(f"MEGATRON_ZAYA_KERNELS=triton but the Triton {name} kernels cannot be imported") from _import_errors.get(name)
    return mod


# --------------------------------------------------------------------------- norms / residual


def _keep_inputs_only(fn, *args):
    """fn(*args) keeping only args for the backward, the rest recomputed then (selective recomputation)."""
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The Triton kernel and the reference's autograd function both keep only x and the per-row rstd:
    nothing worth recomputing (--recompute-modules layernorm)."""
    mod = _triton("rmsnorm", x, weight)
    if mod:
        return mod.rms_norm(x, weight, eps)
    return _ref("rms_norm")(x, weight, eps)


def scaled_residual_add(out, residual, out_scale, out_bias, res_scale, res_bias) -> torch.Tensor:
    args = (out, residual, out_scale, out_bias, res_scale, res_bias)
    mod = _triton("rmsnorm", *args)
    return mod.scaled_residual_add(*args) if mod else _ref("scaled_residual_add")(*args)


def scaled_residual_add_rms_norm(out, residual, out_scale, out_bias, res_scale, res_bias, norm_weight, eps,
                                 norm_dtype=None):
    args = (out, residual, out_scale, out_bias, res_scale, res_bias, norm_weight)
    mod = _triton("rmsnorm", *args)
    if mod:
        return mod.scaled_residual_add_rms_norm(*args, eps, norm_dtype)
    return _ref("scaled_residual_add_rms_norm")(*args, eps, norm_dtype)


# --------------------------------------------------------------------------- SwiGLU / RoPE


def swiglu(gate_up: torch.Tensor, recompute: bool = False) -> torch.Tensor:
    """recompute: the reference keeps only gate_up for the backward (not the SiLU output) and runs again
    then; the Triton kernel keeps only gate_up in any case."""
    mod = _triton("swiglu", gate_up)
    if mod:
        return mod.swiglu(gate_up)
    return _keep_inputs_only(_ref("swiglu"), gate_up) if recompute else _ref("swiglu")(gate_up)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    mod = _triton("rope", x, cos, sin)
    return mod.apply_partial_rope(x, cos, sin) if mod else _ref("apply_partial_rope")(x, cos, sin)


def apply_partial_rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """In-place partial RoPE (x must have a unit stride on the head dim); returns x."""
    mod = _triton("rope", x, cos, sin)
    return mod.apply_partial_rope_(x, cos, sin) if mod else reference.apply_partial_rope_(x, cos, sin)


def apply_partial_rope_qk_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """In-place partial RoPE on q and k (unit stride on the head dim); returns (q, k)."""
    mod = _triton("rope", q, k, cos, sin)
    return mod.apply_partial_rope_qk_(q, k, cos, sin) if mod else reference.apply_partial_rope_qk_(q, k, cos, sin)


# --------------------------------------------------------------------------- cross-entropy


def _ce_ops(*tensors):
    return _triton("cross_entropy", *tensors) or reference


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, overwrite_logits: bool = False) -> torch.Tensor:
    """Per-token fp32 cross-entropy (no reduction); label -100 gives loss 0, as in F.cross_entropy.
    overwrite_logits: the caller will not read logits again (the CPU reference then builds the
    gradient in their memory; the Triton path keeps the logits and ignores it)."""
    ops = _ce_ops(logits, labels)
    if ops is reference:
        return _ref("cross_entropy")(logits, labels, overwrite_logits)
    from megatron_zaya.kernels.ce_autograd import VocabParallelCrossEntropy

    return VocabParallelCrossEntropy.apply(logits, labels, 0, None, reference.IGNORE_INDEX, ops)


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, vocab_start: int = 0, group=None,
    ignore_index: int = reference.IGNORE_INDEX,
) -> torch.Tensor:
    """Per-token fp32 loss when this rank holds logits columns [vocab_start, vocab_start + V).
    The partials are combined with all-reduces over `group` (None: a single rank)."""
    from megatron_zaya.kernels.ce_autograd import VocabParallelCrossEntropy

    return VocabParallelCrossEntropy.apply(logits, labels, int(vocab_start), group, ignore_index, _ce_ops(logits, labels))


def cross_entropy_partials(logits, labels, vocab_start: int = 0):
    return _ce_ops(logits, labels).cross_entropy_partials(logits, labels, vocab_start)


combine_cross_entropy_partials = reference.combine_cross_entropy_partials


def cross_entropy_grad(logits, labels, lse, grad_loss, vocab_start: int = 0,
                       ignore_index: int = reference.IGNORE_INDEX, inplace: bool = False):
    return _ce_ops(logits, labels).cross_entropy_grad(logits, labels, lse, grad_loss, vocab_start, ignore_index, inplace)


def lm_head_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token fp32 cross-entropy (no reduction) of the LM head's logits F.linear(hidden, weight), (N, D)
    and (V, D), under autocast as F.linear would run. The Triton path: the logits, then cross_entropy;
    the PyTorch path: reference.lm_head_cross_entropy (the loss gradient's scale on the small operands)."""
    device = hidden.device.type
    if _ce_ops(hidden, weight, labels) is not reference or _compile_reference:
        return cross_entropy(F.linear(hidden, weight), labels, overwrite_logits=True)
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    with torch.autocast(device, enabled=False):
        return reference.lm_head_cross_entropy(hidden, weight.to(hidden.dtype), labels)


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, reduction: str = "mean",
    ignore_index: int = reference.IGNORE_INDEX, vocab_start: int = 0, group=None, chunk_rows: int | None = None,
) -> torch.Tensor:
    """LM head + cross-entropy without the (tokens x vocab) fp32 logits: chunked over tokens,
    gradients computed in the forward. Scalar loss ("mean" over non-ignored tokens, or "sum").
    weight may be a vocab slice (vocab-parallel) starting at vocab_start, combined over `group`."""
    from megatron_zaya.kernels.ce_autograd import LinearCrossEntropy

    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    ops = _ce_ops(hidden, weight, labels)
    return LinearCrossEntropy.apply(hidden, weight, labels, int(vocab_start), group, reduction, ignore_index, chunk_rows, ops)


# --------------------------------------------------------------------------- MoE permute


def moe_permute(x: torch.Tensor, expert_index: torch.Tensor, num_experts: int):
    mod = _triton("moe_permute", x, expert_index)
    return mod.moe_permute(x, expert_index, num_experts) if mod else reference.moe_permute(x, expert_index, num_experts)


def moe_unpermute(expert_out: torch.Tensor, order: torch.Tensor, gate: torch.Tensor, num_tokens: int) -> torch.Tensor:
    mod = _triton("moe_permute", expert_out, order, gate)
    impl = mod.moe_unpermute if mod else reference.moe_unpermute
    return impl(expert_out, order, gate, num_tokens)


# --------------------------------------------------------------------------- Newton-Schulz


def newton_schulz(grad: torch.Tensor, steps: int = 5, eps: float = 1e-7, dtype=torch.bfloat16,
                  scale: float = 1.0) -> torch.Tensor:
    """scale x the orthogonalised (..., m, n) matrices of grad, in `dtype` (see reference.newton_schulz)."""
    mod = None if dtype == torch.float64 else _triton("newton_schulz", grad)    # float64 only in the reference
    if mod:
        out = mod.newton_schulz(grad, steps, eps, dtype)
        return out.mul_(scale) if scale != 1.0 else out
    return reference.newton_schulz(grad, steps, eps, dtype, scale)


def newton_schulz_many(grads: list, steps: int = 5, eps: float = 1e-7, dtype=torch.bfloat16) -> list:
    """newton_schulz on a list of matrices; the Triton path batches same-shape matrices together."""
    mod = None if dtype == torch.float64 else _triton("newton_schulz", *grads)
    return mod.newton_schulz_many(grads, steps, eps, dtype) if mod else reference.newton_schulz_many(grads, steps, eps, dtype)


__all__ = [
    "set_kernel_backend", "kernel_backend", "triton_available", "reference", "set_reference_compile",
    "reference_compiled",
    "rms_norm", "scaled_residual_add", "scaled_residual_add_rms_norm", "swiglu",
    "apply_partial_rope", "apply_partial_rope_", "apply_partial_rope_qk_", "rotate_half", "qk_norm", "cross_entropy",
    "vocab_parallel_cross_entropy", "cross_entropy_partials", "combine_cross_entropy_partials",
    "cross_entropy_grad", "linear_cross_entropy", "lm_head_cross_entropy", "moe_permute", "moe_unpermute",
    "newton_schulz", "newton_schulz_many", "NS_COEFFICIENTS",
]


# --------------------------------------------------------------------------- CCA convolutions


def cca_causal_conv(packed, dw_weight, dw_bias, g_weight, g_bias, left=None) -> torch.Tensor:
    """Depthwise then grouped causal Conv1d over time on channel-last (B, S, C) q0/k0 (see reference)."""
    tensors = (packed, dw_weight, dw_bias, g_weight, g_bias) + ((left,) if left is not None else ())
    mod = _triton("cca_conv", *tensors)
    impl = mod.cca_causal_conv if mod else reference.cca_causal_conv
    return impl(packed, dw_weight, dw_bias, g_weight, g_bias, left)


def cca_causal_conv_segmented(packed, dw_weight, dw_bias, g_weight, g_bias, visible, recompute=False) -> torch.Tensor:
    """cca_causal_conv restarted where `visible` (B, S, lags) says (packed documents). recompute: the
    reference keeps only its inputs for the backward (not its shifted inputs and taps) and runs again
    then; the Triton kernel keeps only its inputs in any case."""
    args = (packed, dw_weight, dw_bias, g_weight, g_bias, visible)
    mod = _triton("cca_conv", *args)
    if mod:
        return mod.cca_causal_conv_segmented(*args)
    return _keep_inputs_only(reference.cca_causal_conv_segmented, *args) if recompute else \
        reference.cca_causal_conv_segmented(*args)


__all__ += ["cca_causal_conv", "cca_causal_conv_segmented"]
