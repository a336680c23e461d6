"""Readable PyTorch reference implementations of every fused op.

These functions are the single source of truth for the math: the Triton kernels in this package
must match them (forward and backward) and the CPU path runs them directly. Keep them plain.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

# The MoE permute / unpermute references live in reference_moe.py; they are part of this module's API.
from megatron_zaya.kernels.reference_moe import (GatherRows, class_counts, expert_order,  # noqa: F401
                                                 inverse_rows, moe_permute, moe_unpermute)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / rms(x), rms(x) = sqrt(mean(x^2) + eps) over the last dimension, computed in fp32
    (x's dtype if wider); x / rms(x) is rounded to x's dtype before the weight (result: their promoted
    dtype). Backward written out (_RMSNorm)."""
    return _RMSNorm.apply(x, weight, eps)


class _RMSNorm(torch.autograd.Function):
    """With r = 1 / rms(x) per row, y = w * x r and g the output's gradient:
    dx = r (g w) - x r^3 (sum_j g_j w_j x_j) / D and dw = sum over rows of g x r. Keeps x and r only
    (the Triton kernel's choice too); about nine full-size passes where autograd through the composed
    ops takes about twenty, and none of the composed ops' fp32 copies is kept."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        x_c = x.to(_compute_dtype(x))
        rstd = torch.linalg.vector_norm(x_c, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(eps).rsqrt_()
        ctx.save_for_backward(x, weight, rstd)
        return (x_c * rstd).to(x.dtype) * weight

    @staticmethod
    @once_differentiable     # its backward is not differentiable again: an error, not wrong numbers
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        d = x.shape[-1]
        x_c, g, r = x.to(rstd.dtype).reshape(-1, d), grad.to(rstd.dtype).reshape(-1, d), rstd.reshape(-1, 1)
        w = weight.to(rstd.dtype)
        g_x = g * x_c
        # Row sums and column sums of g x as matrix-vector products: one read each.
        coefficient = (g_x @ w).unsqueeze(-1).mul_(r.pow(3)).div_(d)
        grad_x = torch.mul(g, w).mul_(r).addcmul_(x_c, coefficient, value=-1)
        grad_weight = (r.view(1, -1) @ g_x).view(d).to(weight.dtype) if ctx.needs_input_grad[1] else None
        return grad_x.view(x.shape).to(x.dtype), grad_weight, None


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def scaled_residual_add(
    out: torch.Tensor,
    residual: torch.Tensor,
    out_scale: torch.Tensor,
    out_bias: torch.Tensor,
    res_scale: torch.Tensor,
    res_bias: torch.Tensor,
) -> torch.Tensor:
    """ZAYA1 learned residual scaling: (out + out_bias) * out_scale + (residual + res_bias) * res_scale.

    The residual stream stays fp32: the result has residual's dtype, and so has the arithmetic.
    Backward written out (_ScaledResidualAdd)."""
    return _ScaledResidualAdd.apply(out, residual, out_scale, out_bias, res_scale, res_bias)


class _ScaledResidualAdd(torch.autograd.Function):
    """Computed as residual * res_scale + out * out_scale + (out_bias * out_scale + res_bias * res_scale):
    two full-size passes. With g the gradient: d out = g out_scale, d residual = g res_scale,
    d out_scale = sum over rows of g (out + out_bias), d out_bias = out_scale sum(g), and likewise for
    the residual's pair. Keeps out and residual (not the composed ops' two fp32 sums)."""

    @staticmethod
    def forward(ctx, out, residual, out_scale, out_bias, res_scale, res_bias):
        ctx.save_for_backward(out, residual, out_scale, out_bias, res_scale, res_bias)
        os, ob, rs, rb = (t.to(residual.dtype) for t in (out_scale, out_bias, res_scale, res_bias))
        return torch.addcmul(ob * os + rb * rs, residual, rs).addcmul_(out, os)

    @staticmethod
    def backward(ctx, grad):
        out, residual, *params = ctx.saved_tensors
        os, ob, rs, rb = (t.to(residual.dtype) for t in params)
        d = residual.shape[-1]
        g = grad.to(residual.dtype).reshape(-1, d)
        column_sum = g.sum(0)
        grad_out, grad_residual = torch.mul(grad, os), torch.mul(grad, rs)
        grad_os = (g * out.reshape(-1, d)).sum(0).add_(ob * column_sum)
        grad_rs = (g * residual.reshape(-1, d)).sum(0).add_(rb * column_sum)
        grads = (grad_out, grad_residual, grad_os, column_sum * os, grad_rs, column_sum * rs)
        return tuple(t.to(p.dtype) for t, p in zip(grads, (out, residual, *params)))   # each input's dtype


def scaled_residual_add_rms_norm(
    out: torch.Tensor,
    residual: torch.Tensor,
    out_scale: torch.Tensor,
    out_bias: torch.Tensor,
    res_scale: torch.Tensor,
    res_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    norm_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual merge followed by the next sublayer's RMSNorm.

    Returns (new_residual in residual's dtype, normed in norm_dtype or residual's dtype)."""
    new_residual = scaled_residual_add(out, residual, out_scale, out_bias, res_scale, res_bias)
    normed = rms_norm(new_residual, norm_weight, eps)
    if norm_dtype is not None:
        normed = normed.to(norm_dtype)
    return new_residual, normed


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up, where gate and up are the two halves of the last dimension."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def embedding(tokens: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.embedding; a CPU weight in a low-precision dtype (bf16 under ZeRO-1) gets its gradient summed in
    fp32 and rounded once: CPU's own backward adds every occurrence of a token in the weight's dtype, and
    the rows of frequent tokens came out 5-15% off. (GPU kernels already sum in fp32.)"""
    if weight.dtype not in (torch.bfloat16, torch.float16) or weight.is_cuda or not (
            torch.is_grad_enabled() and weight.requires_grad):
        return F.embedding(tokens, weight)
    return _EmbeddingSummedInFp32.apply(tokens, weight)


class _EmbeddingSummedInFp32(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tokens, weight):
        ctx.save_for_backward(tokens)
        ctx.weight_shape, ctx.weight_dtype = weight.shape, weight.dtype
        return F.embedding(tokens, weight)

    @staticmethod
    def backward(ctx, grad):
        (tokens,) = ctx.saved_tensors
        dim = ctx.weight_shape[1]
        rows, inverse = torch.unique(tokens.reshape(-1), return_inverse=True)     # fp32 sums of the rows used
        sums = torch.zeros(len(rows), dim, dtype=torch.float32, device=grad.device)
        sums.index_add_(0, inverse, grad.reshape(-1, dim).float())
        weight_grad = torch.zeros(ctx.weight_shape, dtype=ctx.weight_dtype, device=grad.device)
        weight_grad[rows] = sums.to(ctx.weight_dtype)
        return None, weight_grad


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX (rotate-half) RoPE on the first cos.shape[-1] channels of each head.

    x: (B, S, H, dh); cos, sin: (B or 1, S, rotary_dim). The remaining channels pass through."""
    rotary_dim = cos.shape[-1]
    cos = cos.unsqueeze(2).to(x.dtype)
    sin = sin.unsqueeze(2).to(x.dtype)
    # split, not two slices: its backward is one cat (a slice's backward zero-fills a full-size buffer).
    x_rot, x_pass = x.split((rotary_dim, x.shape[-1] - rotary_dim), dim=-1)
    x_rot = x_rot * cos + rotate_half(x_rot) * sin
    return torch.cat((x_rot, x_pass), dim=-1)


def qk_norm(x: torch.Tensor, temperature: torch.Tensor | None = None) -> torch.Tensor:
    """CCA's QK-norm: each head vector of (B, S, H, dh) x scaled to length sqrt(dh) (its norm floored at
    x's dtype eps), times a per-head temperature (H,) when given (the keys' linear temperature).
    = x * (sqrt(dh) / ||x||.clamp_min(eps) * T), with the backward written out (_QKNorm)."""
    return _QKNorm.apply(x, temperature)


class _QKNorm(torch.autograd.Function):
    """With f = sqrt(dh) / max(||x||, eps) * T per row and g the output's gradient:
    dx = f * (g - (g . x) / ||x||^2 * x) (no projection where the norm is floored) and
    dT = sum over the head's rows of sqrt(dh) / max(||x||, eps) * (g . x): three full-size passes
    where autograd through the composed ops takes about seven. Keeps x and the fp32 norm (x's dtype if
    wider); the factors are recomputed from them."""

    @staticmethod
    def forward(ctx, x, temperature):
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=_compute_dtype(x))
        ctx.save_for_backward(x, norm, temperature)
        return x * _qk_norm_factors(x, norm, temperature)[1].to(x.dtype)

    @staticmethod
    @once_differentiable     # its backward is not differentiable again: an error, not wrong numbers
    def backward(ctx, grad):
        x, norm, temperature = ctx.saved_tensors
        base, factor = _qk_norm_factors(x, norm, temperature)
        g_dot_x = torch.linalg.vecdot(grad, x).to(norm.dtype).unsqueeze(-1)
        projection = (g_dot_x / norm.square()).masked_fill_(norm <= torch.finfo(x.dtype).eps, 0.0)
        grad_x = torch.addcmul(grad, x, projection.to(x.dtype), value=-1).mul_(factor.to(x.dtype))
        grad_temperature = (base * g_dot_x).sum(dim=(0, 1, 3)) if ctx.needs_input_grad[1] else None
        return grad_x, grad_temperature


def _qk_norm_factors(x, norm, temperature):
    """(sqrt(dh) / max(norm, eps), the same times the per-head temperature) in norm's dtype."""
    base = math.sqrt(x.shape[-1]) / norm.clamp_min(torch.finfo(x.dtype).eps)
    return base, base if temperature is None else base * temperature.to(norm.dtype)[:, None]


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, overwrite_logits: bool = False) -> torch.Tensor:
    """Per-token cross-entropy in fp32 (fp64 for fp64 logits; no reduction); label IGNORE_INDEX (-100) gives 0.
    logits: (N, V), labels: (N,). = F.cross_entropy(logits.float(), labels, reduction="none"):
    the loss bit for bit (-log_softmax in fp32 at the label, row by row), its gradient
    (softmax - onehot(label)) * grad_loss up to rounding (the unscaled part is rounded to logits'
    dtype in the forward: two roundings in bf16 instead of one).
    overwrite_logits: the caller no longer needs logits, so the gradient is built in their memory."""
    if not (torch.is_grad_enabled() and logits.requires_grad):
        return _blocked_cross_entropy(logits, labels, None)
    return _BlockedCrossEntropy.apply(logits, labels, overwrite_logits)


_CE_BLOCK_ELEMENTS = 1 << 18   # 1 MiB of fp32: measured best of 2^16..2^26 at 2048 x 8192 and x 32768


def _row_blocks(logits: torch.Tensor):
    """Row ranges of about _CE_BLOCK_ELEMENTS logits each (a block's fp32 softmax stays in cache)."""
    rows = max(1, _CE_BLOCK_ELEMENTS // max(1, logits.shape[-1]))
    return ((start, min(start + rows, logits.shape[0])) for start in range(0, logits.shape[0], rows))


def _blocked_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, grad: torch.Tensor | None):
    """Per-row fp32 losses, block by block; with `grad` (logits' shape and dtype, possibly logits
    themselves) also softmax - onehot(label) written into it."""
    target = labels.clamp_min(0).unsqueeze(1)
    compute = _compute_dtype(logits)        # fp32, or fp64 for a float64 model (its reference checks)
    loss = torch.empty(logits.shape[0], dtype=compute, device=logits.device)
    for start, stop in _row_blocks(logits):
        log_probs = F.log_softmax(logits[start:stop].to(compute), dim=-1)
        loss[start:stop] = -log_probs.gather(1, target[start:stop]).squeeze(1)
        if grad is not None:
            probs = log_probs.exp_()
            probs.scatter_add_(1, target[start:stop], probs.new_full((stop - start, 1), -1.0))
            grad[start:stop].copy_(probs)
    return loss.masked_fill_(labels == IGNORE_INDEX, 0.0)


class _BlockedCrossEntropy(torch.autograd.Function):
    """cross_entropy in blocks of rows, with the gradient's unscaled part made in the forward.

    Each block's fp32 log-softmax gives the loss at the label and, exponentiated in place, the
    softmax: softmax - onehot(label) is written in logits' dtype (into the logits themselves when
    the caller allows it) and saved instead of the logits, so the backward is one multiply by the
    per-row loss gradient. One softmax per block instead of two (forward and backward), and no
    (N, V) fp32 tensor, zero fill or cast, which nll_loss(log_softmax) has. Without autograd
    (evaluation) `cross_entropy` computes the losses alone."""

    @staticmethod
    def forward(ctx, logits, labels, overwrite_logits=False):
        grad = logits.detach() if overwrite_logits else torch.empty_like(logits)
        loss = _blocked_cross_entropy(logits, labels, grad)
        ctx.save_for_backward(grad, labels != IGNORE_INDEX)
        ctx.backward_done = False
        return loss

    @staticmethod
    @once_differentiable     # its backward is not differentiable again: an error, not wrong numbers
    def backward(ctx, grad_loss):
        if ctx.backward_done:
            raise RuntimeError("cross_entropy: a second backward through the same graph (retain_graph) is not "
                               "supported: its saved gradient was scaled in place by the first")
        ctx.backward_done = True
        grad, valid = ctx.saved_tensors
        scale = grad_loss.to(_compute_dtype(grad)).masked_fill(~valid, 0.0).unsqueeze(1)
        low_precision_scale = scale.to(grad.dtype)
        if torch.equal(low_precision_scale.to(scale.dtype), scale):
            # Exact in logits' dtype (e.g. 1 / 2^k from a mean, or 0): one multiply in that dtype,
            # the same rounding as the fp32 product (a mixed-dtype in-place multiply is 4x slower on CPU).
            return grad.mul_(low_precision_scale), None, None
        for start, stop in _row_blocks(grad):
            block = grad[start:stop]
            block.copy_(block.to(scale.dtype).mul_(scale[start:stop]))
        return grad, None, None


def lm_head_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token fp32 cross-entropy of the logits hidden @ weight.T (hidden (N, D), weight (V, D), one
    dtype), as cross_entropy(hidden @ weight.T, labels) computes it. With autograd, the logits' gradient
    softmax - onehot is built in their memory in the forward and the loss gradient's per-row scale is
    applied in the backward to the small operands, (N, D) and (N, D), instead of to the (N, V)
    gradient: dh = scale * (G @ W), dW = G.T @ (scale * h). The gradient is left as it is, so a second
    backward through the graph (retain_graph) is exact too."""
    if not (torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)):
        return _blocked_cross_entropy(hidden @ weight.t(), labels, None)
    return _LMHeadCrossEntropy.apply(hidden, weight, labels)


class _LMHeadCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels):
        logits = hidden @ weight.t()
        loss = _blocked_cross_entropy(logits, labels, logits)      # logits now hold softmax - onehot
        ctx.save_for_backward(logits, hidden, weight, labels != IGNORE_INDEX)
        return loss

    @staticmethod
    @once_differentiable     # its backward is not differentiable again: an error, not wrong numbers
    def backward(ctx, grad_loss):
        grad, hidden, weight, valid = ctx.saved_tensors
        scale = grad_loss.to(_compute_dtype(grad)).masked_fill(~valid, 0.0).unsqueeze(1)
        grad_hidden = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_hidden = (grad @ weight).to(scale.dtype).mul_(scale).to(hidden.dtype)
        if ctx.needs_input_grad[1]:
            grad_weight = grad.t() @ (hidden.to(scale.dtype) * scale).to(hidden.dtype)
        return grad_hidden, grad_weight, None


# Quintic Newton-Schulz coefficients (Keller Jordan's Muon): converge fast to an approximate
# orthogonalisation with singular values in roughly [0.7, 1.2].
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


NEWTON_SCHULZ_CPU_CHUNK_BYTES = 6 << 20   # matrices per batched call on CPU: about this much of X


def newton_schulz(grad: torch.Tensor, steps: int = 5, eps: float = 1e-7, dtype=torch.bfloat16,
                  scale: float = 1.0) -> torch.Tensor:
    """Approximate U V^T of each matrix in grad (..., m, n) with the quintic Newton-Schulz iteration,
    times `scale` (Muon's update factor, folded into the last step).

    Runs in `dtype` (bf16 on accelerators, as in Muon) and returns that dtype, contiguous. Each step
    is gram = X X^T, poly = b gram + c gram^2, X = a X + poly X, the last two as one baddbmm each (one
    rounding per product-and-sum instead of three). A tall matrix (m > n) takes the same polynomial
    from the right, gram = X^T X (n x n) and X = a X + X poly (p(X X^T) X = X p(X^T X)), so it is
    never transposed: the caller's update is read in its own layout. At zaya1-100m's shapes in bf16 on
    CPU: about half the error against float64 of separate matmuls, scalings and adds, and Muon's step
    ~20% faster (bench/muon_step.py; one shape group slower, see BENCHMARKS.md). On CPU a large batch
    runs a few matrices at a time (NEWTON_SCHULZ_CPU_CHUNK_BYTES of X), all steps on each chunk while
    it is in cache, the last step writing straight into its rows of the result: the same arithmetic;
    Muon's step 8-11% faster at zaya1-100m (bench/muon_step.py --cpu-chunk-bytes 0 6291456)."""
    x = grad.to(dtype)
    shape = x.shape
    x = x.reshape(-1, shape[-2], shape[-1])
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    per_chunk = max(len(x), 1)
    if x.device.type == "cpu" and NEWTON_SCHULZ_CPU_CHUNK_BYTES:
        per_chunk = max(1, NEWTON_SCHULZ_CPU_CHUNK_BYTES // max(1, shape[-2] * shape[-1] * x.element_size()))
    for lo in range(0, len(x), per_chunk):
        _newton_schulz_steps(x[lo:lo + per_chunk], steps, eps, scale, out[lo:lo + per_chunk])
    return out.view(shape)


def _newton_schulz_steps(x: torch.Tensor, steps: int, eps: float, scale: float, out: torch.Tensor) -> None:
    """The iteration on a (batch, m, n) stack, scale times the result written into `out`."""
    a, b, c = NS_COEFFICIENTS
    tall = x.shape[-2] > x.shape[-1]
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + eps)
    if steps == 0:
        torch.mul(x, scale, out=out)
    for step in range(steps):
        last = step == steps - 1
        gram = torch.bmm(x.transpose(-2, -1), x) if tall else torch.bmm(x, x.transpose(-2, -1))
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        alpha, beta = (scale, a * scale) if last else (1.0, a)
        left, right = (x, poly) if tall else (poly, x)
        x = torch.baddbmm(x, left, right, beta=beta, alpha=alpha, out=out if last else None)


# --------------------------------------------------------------------------------------------
# Additions for the fused kernels: in-place RoPE, combinable cross-entropy partials (vocab
# parallel), cross-entropy fused with the LM head, batched Newton-Schulz over a list of matrices.

IGNORE_INDEX = -100


def apply_partial_rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """In-place apply_partial_rope: rotates x's first rotary_dim channels and returns x."""
    return x.copy_(apply_partial_rope(x, cos, sin))


def apply_partial_rope_qk_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """In-place partial RoPE on both q (B, S, HQ, dh) and k (B, S, HKV, dh); returns (q, k)."""
    return apply_partial_rope_(q, cos, sin), apply_partial_rope_(k, cos, sin)


def cross_entropy_partials(
    logits: torch.Tensor, labels: torch.Tensor, vocab_start: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row partials of one vocab slice (columns vocab_start .. vocab_start + V - 1), all fp32:
    max of the slice, sum of exp(logit - max) over it, and the target logit (0 if the label is
    not in the slice)."""
    z = logits.float()
    row_max = z.max(dim=-1).values
    shift = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)  # all -inf slice: sumexp 0
    sumexp = torch.exp(z - shift.unsqueeze(-1)).sum(dim=-1)
    local = labels - vocab_start
    in_slice = (local >= 0) & (local < z.shape[-1])
    target = z.gather(-1, local.clamp(0, z.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
    return row_max, sumexp, torch.where(in_slice, target, torch.zeros_like(target))


def combine_cross_entropy_partials(
    row_max: torch.Tensor,
    sumexp: torch.Tensor,
    target: torch.Tensor,
    labels: torch.Tensor,
    group=None,
    ignore_index: int = IGNORE_INDEX,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge the partials of every vocab slice: all-reduces over `group` when it has more than one
    rank (max of the maxima, sum of the rescaled sum-exps, sum of the target logits).
    Returns (loss per row, 0 where label == ignore_index; log-sum-exp per row)."""
    import torch.distributed as dist

    distributed = group is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1
    global_max = row_max.clone()
    if distributed:
        dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
    total = torch.where(sumexp > 0, sumexp * torch.exp(row_max - global_max), torch.zeros_like(sumexp))
    target = target.clone()
    if distributed:
        dist.all_reduce(total, group=group)
        dist.all_reduce(target, group=group)
    lse = global_max + torch.log(total)
    loss = torch.where(labels == ignore_index, torch.zeros_like(lse), lse - target)
    return loss, lse


def cross_entropy_grad(
    logits: torch.Tensor,
    labels: torch.Tensor,
    lse: torch.Tensor,
    grad_loss: torch.Tensor,
    vocab_start: int = 0,
    ignore_index: int = IGNORE_INDEX,
    inplace: bool = False,
) -> torch.Tensor:
    """d(loss)/d(logits) of one vocab slice: (softmax - onehot(label)) * grad_loss per row,
    zero on rows whose label is ignore_index. Returned in logits' dtype (into logits if inplace)."""
    z = logits.float()
    grad = torch.exp(z - lse.unsqueeze(-1))
    local = labels - vocab_start
    in_slice = (local >= 0) & (local < z.shape[-1])
    rows = torch.nonzero(in_slice).squeeze(-1)
    grad[rows, local[rows]] -= 1.0
    scale = torch.where(labels == ignore_index, torch.zeros_like(lse), grad_loss.float())
    grad = (grad * scale.unsqueeze(-1)).to(logits.dtype)
    return logits.copy_(grad) if inplace else grad


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    reduction: str = "mean",
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """LM head + cross-entropy: logits = hidden @ weight.T (in hidden's dtype), loss in fp32,
    averaged over the non-ignored tokens ("mean") or summed ("sum")."""
    logits = hidden.reshape(-1, hidden.shape[-1]) @ weight.t()
    loss = F.cross_entropy(logits.float(), labels.reshape(-1), reduction="none", ignore_index=ignore_index)
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / (labels != ignore_index).sum().clamp(min=1)


def newton_schulz_many(grads: list[torch.Tensor], steps: int = 5, eps: float = 1e-7, dtype=torch.bfloat16) -> list[torch.Tensor]:
    """newton_schulz on each matrix of a list (e.g. every expert's weight gradient)."""
    return [newton_schulz(g, steps, eps, dtype) for g in grads]


def cca_causal_conv(
    packed: torch.Tensor,
    dw_weight: torch.Tensor,
    dw_bias: torch.Tensor,
    g_weight: torch.Tensor,
    g_bias: torch.Tensor,
    left: torch.Tensor | None = None,
) -> torch.Tensor:
    """CCA's causal convolution pair over time: a depthwise then a grouped convolution (Conv1d weights).

    packed: (B, S, C) channel-last (concat of q0 and k0); dw_weight (C, 1, K1), dw_bias (C,);
    g_weight (C, C // groups, K2), g_bias (C,); left: (B, C, K1 - 1 + K2 - 1) inputs of the
    preceding steps, or None for zeros (the zero padding sits before the first conv, so its bias
    acts on the padded steps). Returns (B, S, C)."""
    channels = packed.shape[-1]
    context = dw_weight.shape[-1] - 1 + g_weight.shape[-1] - 1
    x = F.pad(packed, (0, 0, context, 0)) if left is None else torch.cat((left.transpose(1, 2).to(packed.dtype),
                                                                          packed), dim=1)
    # (B, S', C) seen as (B, C, 1, S') in channels-last memory: the same bytes, which oneDNN's (and cuDNN's)
    # convolutions take as they are. Conv1d on (B, C, S') copied its input, output and gradients between
    # the two layouts: 2.1-3.0x slower forward+backward in bf16 on CPU at zaya1-tiny's and zaya1-100m's
    # shapes, the same arithmetic (bench/cca_conv.py, BENCHMARKS.md).
    empty = packed.shape[1] == 0    # no positions: one step more for the convs to read, its output dropped
    x = F.pad(x, (0, 0, 1, 0)) if empty else x
    x = x.transpose(1, 2).unsqueeze(2)
    y = F.conv2d(x, dw_weight.unsqueeze(2), dw_bias, groups=channels)
    y = F.conv2d(y.contiguous(memory_format=torch.channels_last), g_weight.unsqueeze(2), g_bias,
                 groups=channels // g_weight.shape[1])
    y = y.squeeze(2).transpose(1, 2)
    return y[:, 1:] if empty else y


def cca_causal_conv_segmented(
    packed: torch.Tensor,
    dw_weight: torch.Tensor,
    dw_bias: torch.Tensor,
    g_weight: torch.Tensor,
    g_bias: torch.Tensor,
    visible: torch.Tensor,
) -> torch.Tensor:
    """cca_causal_conv where step t takes step t - l into account only if visible[:, t, l - 1]
    (B, S, lags >= K1 - 1 + K2 - 1), e.g. only inside its own document of a packed sequence: each
    document is then convolved as a sequence of its own (zeros before it, so the steps before its
    start enter the grouped conv as the depthwise bias, as at a sequence start). Written as shifted
    sums over the taps (the kernels are a few steps long); (B, S, C) channel-last in and out."""
    b, s, c = packed.shape
    k1, k2 = dw_weight.shape[-1], g_weight.shape[-1]

    def back(t: torch.Tensor, lag: int) -> torch.Tensor:       # row t - lag at row t; zeros before the start
        return t if lag == 0 else F.pad(t, (0, 0, lag, 0))[:, :s]

    steps = torch.arange(s, device=packed.device)[:, None]

    def seen(lag: int) -> torch.Tensor:       # (B, S, 1): may row t use row t - lag (none before the start)
        return (visible[..., lag - 1:lag] & (steps >= lag)).to(packed.dtype)

    w1 = dw_weight[:, 0, :]                                     # (C, K1): tap j reads lag K1 - 1 - j
    y = dw_bias + packed * w1[:, k1 - 1]
    for j in range(k1 - 1):
        y = y + back(packed, k1 - 1 - j) * seen(k1 - 1 - j) * w1[:, j]
    groups = c // g_weight.shape[1]
    w2 = g_weight.view(groups, c // groups, g_weight.shape[1], k2)   # (G, out, in, K2)
    out = g_bias.expand(b, s, c)
    for i in range(k2):
        lag = k2 - 1 - i
        tap = y if lag == 0 else back(y, lag) * seen(lag) + dw_bias * (1 - seen(lag))
        out = out + torch.einsum("bsgi,goi->bsgo", tap.reshape(b, s, groups, -1), w2[..., i]).reshape(b, s, c)
    return out
