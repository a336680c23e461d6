"""Batched quintic Newton-Schulz for Muon (Triton), many same-shape matrices per launch.

One iteration on X (batch, m, n), m <= n, is
    G = X X^T                      (symmetric: `_syrk` computes only tiles with i <= j and
    B = b G + c G G^T              mirrors them, about half the FLOPs of a plain matmul)
    X = a X + B X                  (`_gemm_axpby`: matmul with the a X term fused in the epilogue)
so each step is three launches over the whole batch, with fp32 accumulation and storage in the
working dtype (bf16 in Muon), like the reference's batched matmuls. No backward: optimizer only.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from megatron_zaya.kernels._triton_common import PRUNE, configs, dot_acc
from megatron_zaya.kernels.reference import NS_COEFFICIENTS

_MM_CONFIGS = configs(
    [
        triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_warps=w, num_stages=s)
        # the last one fits MI300X's 64 KiB of shared memory in fp32 too (3 stages of 64x32 + 32x64 fp32
        # tiles: 48 KiB); without it an fp32 Newton-Schulz (Muon(ns_dtype=torch.float32)) had no config
        # that launches there
        for bm, bn, bk, w, s in ((128, 128, 64, 8, 3), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4), (64, 64, 32, 4, 3))
    ],
    triton.Config({"BM": 16, "BN": 16, "BK": 16}, num_warps=1),
)
_SYRK_CONFIGS = configs(
    [
        triton.Config({"BM": bm, "BK": bk}, num_warps=w, num_stages=s)
        for bm, bk, w, s in ((128, 64, 8, 3), (64, 64, 4, 4), (64, 32, 4, 3))     # the last: fp32 on MI300X
    ],
    triton.Config({"BM": 16, "BK": 16}, num_warps=1),
)


@triton.autotune(configs=_SYRK_CONFIGS, key=["M", "K", "HAS_ADD"], prune_configs_by=PRUNE)
@triton.jit
def _syrk(a_ptr, add_ptr, c_ptr, M, K, alpha, beta,
          sab, sam, sak, sdb, sdm, sdn, scb, scm, scn,
          HAS_ADD: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    """C = alpha * A A^T + beta * ADD for A (batch, M, K); ADD, C (batch, M, M) symmetric."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m <= pid_n:  # lower-triangle tiles are mirrored from the upper ones
        batch = tl.program_id(2).to(tl.int64)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BM + tl.arange(0, BM)
        rk = tl.arange(0, BK)
        a_base = a_ptr + batch * sab
        acc = tl.zeros((BM, BM), tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + rk
            a = tl.load(a_base + rm[:, None] * sam + kk[None, :] * sak, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
            b = tl.load(a_base + rn[None, :] * sam + kk[:, None] * sak, mask=(rn[None, :] < M) & (kk[:, None] < K), other=0.0)
            acc = dot_acc(a, b, acc, a_ptr)      # fp32: full fp32 products, not TF32
        acc = acc * alpha
        mask = (rm[:, None] < M) & (rn[None, :] < M)
        if HAS_ADD:
            add = tl.load(add_ptr + batch * sdb + rm[:, None] * sdm + rn[None, :] * sdn, mask=mask, other=0.0)
            acc += beta * add.to(tl.float32)
        out = acc.to(c_ptr.dtype.element_ty)
        c_base = c_ptr + batch * scb
        tl.store(c_base + rm[:, None] * scm + rn[None, :] * scn, out, mask=mask)
        if pid_m != pid_n:
            tl.store(c_base + rn[None, :] * scm + rm[:, None] * scn, out, mask=mask)


@triton.autotune(configs=_MM_CONFIGS, key=["M", "N"], prune_configs_by=PRUNE)
@triton.jit
def _gemm_axpby(b_ptr, x_ptr, out_ptr, M, N, alpha,
                sbb, sbm, sbk, sxb, sxm, sxn, sob, som, son,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """OUT = alpha * X + B X for B (batch, M, M), X (batch, M, N)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    b_base = b_ptr + batch * sbb
    x_base = x_ptr + batch * sxb
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, M, BK):
        kk = k0 + rk
        bt = tl.load(b_base + rm[:, None] * sbm + kk[None, :] * sbk, mask=(rm[:, None] < M) & (kk[None, :] < M), other=0.0)
        xt = tl.load(x_base + kk[:, None] * sxm + rn[None, :] * sxn, mask=(kk[:, None] < M) & (rn[None, :] < N), other=0.0)
        acc = dot_acc(bt, xt, acc, b_ptr)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    x = tl.load(x_base + rm[:, None] * sxm + rn[None, :] * sxn, mask=mask, other=0.0).to(tl.float32)
    acc += alpha * x
    tl.store(out_ptr + batch * sob + rm[:, None] * som + rn[None, :] * son, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _s(t):
    return t.stride(0), t.stride(1), t.stride(2)


def newton_schulz(grad: torch.Tensor, steps: int = 5, eps: float = 1e-7, dtype=torch.bfloat16) -> torch.Tensor:
    """Same contract as reference.newton_schulz: (..., m, n) -> (..., m, n) in `dtype`, contiguous."""
    a, b, c = NS_COEFFICIENTS
    shape = grad.shape
    x = grad.to(dtype).reshape(-1, shape[-2], shape[-1])
    transposed = x.shape[-2] > x.shape[-1]
    if transposed:
        x = x.transpose(-2, -1)
    x = (x / (x.norm(dim=(-2, -1), keepdim=True) + eps)).contiguous()
    batch, m, n = x.shape
    if batch * m * n == 0:
        return _in_input_layout(x, transposed, shape)
    gram = torch.empty((batch, m, m), dtype=dtype, device=x.device)
    poly = torch.empty_like(gram)
    x_next = torch.empty_like(x)
    syrk_grid = lambda meta: (triton.cdiv(m, meta["BM"]), triton.cdiv(m, meta["BM"]), batch)  # noqa: E731
    mm_grid = lambda meta: (triton.cdiv(m, meta["BM"]), triton.cdiv(n, meta["BN"]), batch)  # noqa: E731
    for _ in range(steps):
        _syrk[syrk_grid](x, x, gram, m, n, 1.0, 0.0, *_s(x), *_s(x), *_s(gram), HAS_ADD=False)
        _syrk[syrk_grid](gram, gram, poly, m, m, c, b, *_s(gram), *_s(gram), *_s(poly), HAS_ADD=True)
        _gemm_axpby[mm_grid](poly, x, x_next, m, n, a, *_s(poly), *_s(x), *_s(x_next))
        x, x_next = x_next, x
    return _in_input_layout(x, transposed, shape)


def _in_input_layout(x: torch.Tensor, transposed: bool, shape: torch.Size) -> torch.Tensor:
    """The result in the input's shape, contiguous like the reference's (a tall input was worked on transposed)."""
    return (x.transpose(-2, -1).contiguous() if transposed else x).reshape(shape)


def newton_schulz_many(grads: list[torch.Tensor], steps: int = 5, eps: float = 1e-7, dtype=torch.bfloat16) -> list[torch.Tensor]:
    """Group same-shape matrices, run each group as one batch, return results in input order."""
    out: list[torch.Tensor | None] = [None] * len(grads)
    groups: dict[tuple, list[int]] = {}
    for i, g in enumerate(grads):
        groups.setdefault((tuple(g.shape), g.device), []).append(i)
    for idxs in groups.values():
        res = newton_schulz(torch.stack([grads[i] for i in idxs]), steps, eps, dtype)
        for j, i in enumerate(idxs):
            out[i] = res[j]
    return out
