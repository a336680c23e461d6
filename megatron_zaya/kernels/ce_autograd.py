"""Autograd wrappers around the cross-entropy primitives, shared by the Triton and torch backends.

`ops` is a namespace with cross_entropy_partials / cross_entropy_grad (triton_cross_entropy or
reference); combining the partials (with all-reduces over a vocab-parallel group) is the same
small fp32 (N,) computation for both (reference.combine_cross_entropy_partials).
"""
from __future__ import annotations

import torch

from megatron_zaya.kernels import reference


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token loss of a (N, V_slice) logits slice whose full row is spread over `group`."""

    @staticmethod
    def forward(ctx, logits, labels, vocab_start, group, ignore_index, ops):
        row_max, sumexp, target = ops.cross_entropy_partials(logits, labels, vocab_start)
        loss, lse = reference.combine_cross_entropy_partials(row_max, sumexp, target, labels, group, ignore_index)
        ctx.save_for_backward(logits, labels, lse)
        ctx.vocab_start, ctx.ignore_index, ctx.ops = vocab_start, ignore_index, ops
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        logits, labels, lse = ctx.saved_tensors
        dlogits = ctx.ops.cross_entropy_grad(logits, labels, lse, grad_loss, ctx.vocab_start, ctx.ignore_index)
        return dlogits, None, None, None, None, None


def default_chunk_rows(vocab: int, itemsize: int, budget_bytes: int = 1 << 30) -> int:
    """Rows per chunk so that one chunk of logits takes about `budget_bytes`."""
    return max(1, budget_bytes // max(1, vocab * itemsize))


class LinearCrossEntropy(torch.autograd.Function):
    """hidden @ weight.T followed by cross-entropy, chunked over tokens.

    Only one (chunk, V_slice) block of logits exists at a time: the forward computes each chunk's
    logits, its loss, and (when gradients are needed) its logit gradient in place, then folds it
    into d(hidden) and an fp32 d(weight). The backward only scales those by the scalar grad.
    With a vocab-parallel `group`, weight is this rank's vocab slice starting at vocab_start; the
    returned d(hidden) is this rank's partial sum, to be all-reduced by the caller's
    copy-to-tensor-parallel-region op exactly as for any column-parallel linear.
    """

    @staticmethod
    def forward(ctx, hidden, weight, labels, vocab_start, group, reduction, ignore_index, chunk_rows, ops):
        d = hidden.shape[-1]
        h2 = hidden.reshape(-1, d)
        lab = labels.reshape(-1)
        n = h2.shape[0]
        if chunk_rows is None:
            chunk_rows = default_chunk_rows(weight.shape[0], h2.element_size())
        n_valid = (lab != ignore_index).sum().clamp(min=1)
        scale = torch.ones((), dtype=torch.float32, device=h2.device) if reduction == "sum" else 1.0 / n_valid.float()
        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dh = torch.empty_like(h2) if need_dh else None
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_dw else None
        total = torch.zeros((), dtype=torch.float32, device=h2.device)
        for start in range(0, n, chunk_rows):
            hc, lc = h2[start:start + chunk_rows], lab[start:start + chunk_rows]
            logits = hc @ weight.t()
            row_max, sumexp, target = ops.cross_entropy_partials(logits, lc, vocab_start)
            loss, lse = reference.combine_cross_entropy_partials(row_max, sumexp, target, lc, group, ignore_index)
            total += loss.sum()
            if need_dh or need_dw:
                grad_rows = scale.expand(lc.shape[0])
                dlogits = ops.cross_entropy_grad(logits, lc, lse, grad_rows, vocab_start, ignore_index, inplace=True)
                if need_dh:
                    dh[start:start + chunk_rows] = dlogits @ weight
                if need_dw:
                    dw += (dlogits.t() @ hc).float()
        ctx.save_for_backward(*(t for t in (dh, dw) if t is not None))
        ctx.shapes = (need_dh, need_dw, hidden.shape, weight.dtype)
        return total * scale

    @staticmethod
    def backward(ctx, grad):
        need_dh, need_dw, hidden_shape, w_dtype = ctx.shapes
        saved = list(ctx.saved_tensors)
        dh = (saved.pop(0) * grad).view(hidden_shape) if need_dh else None
        dw = (saved.pop(0) * grad).to(w_dtype) if need_dw else None
        return dh, dw, None, None, None, None, None, None, None
