"""Cross-entropy over a large (possibly vocab-parallel) vocabulary without fp32 logits (Triton).

Per row, one pass over the logits slice keeps an online (max, sum-exp) pair in fp32 registers, so
bf16 logits are never upcast in memory. The pass returns the combinable partials

    m      = max_j z_j                 (over this rank's vocab slice)
    s      = sum_j exp(z_j - m)
    target = z[label - vocab_start] if the label falls in this slice, else 0

which ranks merge with all-reduces (max of m; sum of s * exp(m - M); sum of target), giving
lse = M + log(S) and loss = lse - target (0 where label == ignore_index). The gradient kernel
writes (exp(z - lse) - onehot) * grad_loss over the slice, optionally in place into the logits.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from megatron_zaya.kernels._triton_common import INTERPRET, PRUNE, configs

IGNORE_INDEX = -100

_CONFIGS = configs(
    [triton.Config({"BLOCK_V": b}, num_warps=w) for b, w in ((1024, 4), (2048, 8), (4096, 8), (8192, 16))],
    triton.Config({"BLOCK_V": 64}, num_warps=1),
)


@triton.autotune(configs=_CONFIGS, key=["V"], prune_configs_by=PRUNE)
@triton.jit
def _partials_kernel(
    logits_ptr, labels_ptr, max_ptr, sumexp_ptr, target_ptr,
    V, stride_row, vocab_start, BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride_row
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros((), tl.float32)
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        z = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(z, axis=0))
        # shift by 0 while everything seen is -inf (e.g. a padded vocab slice): s stays 0, no NaN
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.sum(tl.exp(z - shift), axis=0)
        m = m_new
    label = tl.load(labels_ptr + row).to(tl.int64)
    local = label - vocab_start
    in_slice = (local >= 0) & (local < V)
    t = tl.load(base + tl.where(in_slice, local, 0), mask=in_slice, other=0.0).to(tl.float32)
    tl.store(max_ptr + row, m)
    tl.store(sumexp_ptr + row, s)
    tl.store(target_ptr + row, tl.where(in_slice, t, 0.0))


@triton.jit
def _grad_kernel(
    logits_ptr, labels_ptr, lse_ptr, gloss_ptr, dlogits_ptr,
    V, stride_row, stride_drow, vocab_start, ignore_index, BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    mask = cols < V
    label = tl.load(labels_ptr + row).to(tl.int64)
    gl = tl.load(gloss_ptr + row).to(tl.float32)
    gl = tl.where(label == ignore_index, 0.0, gl)
    lse = tl.load(lse_ptr + row)
    z = tl.load(logits_ptr + row * stride_row + cols, mask=mask, other=0.0).to(tl.float32)
    p = tl.exp(z - lse)
    p = tl.where(cols == label - vocab_start, p - 1.0, p)
    tl.store(dlogits_ptr + row * stride_drow + cols, (p * gl).to(dlogits_ptr.dtype.element_ty), mask=mask)


def _rows(logits: torch.Tensor) -> torch.Tensor:
    return logits if logits.stride(-1) == 1 else logits.contiguous()


def cross_entropy_partials(logits: torch.Tensor, labels: torch.Tensor, vocab_start: int = 0):
    """(max, sumexp, target) per row of a (N, V_slice) logits slice, all fp32 (N,)."""
    logits = _rows(logits)
    n, v = logits.shape
    out = torch.empty((3, n), dtype=torch.float32, device=logits.device)
    if n:
        _partials_kernel[(n,)](logits, labels.contiguous(), out[0], out[1], out[2], v, logits.stride(0), int(vocab_start))
    return out[0], out[1], out[2]


def cross_entropy_grad(
    logits: torch.Tensor, labels: torch.Tensor, lse: torch.Tensor, grad_loss: torch.Tensor,
    vocab_start: int = 0, ignore_index: int = IGNORE_INDEX, inplace: bool = False,
) -> torch.Tensor:
    """d loss / d logits for a slice: (softmax - onehot) * grad_loss, zero on ignored rows; written into
    `logits` (and returned) when `inplace`."""
    given, logits = logits, _rows(logits)
    n, v = logits.shape
    dlogits = logits if inplace else torch.empty_like(logits)
    if n:
        # Not autotuned: with inplace=True the kernel overwrites its input, which repeated
        # benchmark launches would corrupt.
        block_v = 64 if INTERPRET else 4096
        _grad_kernel[(n, triton.cdiv(v, block_v))](
            logits, labels.contiguous(), lse.contiguous(),
            torch.broadcast_to(grad_loss.float(), (n,)).contiguous(), dlogits,   # a scalar: every row's
            v, logits.stride(0), dlogits.stride(0), int(vocab_start), int(ignore_index),
            BLOCK_V=block_v, num_warps=1 if INTERPRET else 8,
        )
    if inplace and dlogits is not given:      # the kernel wrote into a unit-stride copy of the caller's logits
        return given.copy_(dlogits)
    return dlogits
