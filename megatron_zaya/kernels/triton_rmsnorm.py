"""Fused RMSNorm and ZAYA1 residual merge + RMSNorm (Triton, forward and backward).

Math (see reference.py):
    new_residual = (out + out_bias) * out_scale + (residual + res_bias) * res_scale
    normed       = norm_weight * (new_residual * rstd),  rstd = 1 / sqrt(mean(new_residual^2) + eps)

The fused kernel reads `out` and `residual` once and writes `new_residual` and `normed` once; all
arithmetic runs in fp32 after tl.load whatever the storage dtypes are. The backward kernel
recomputes new_residual from the saved inputs (no extra activation is stored besides rstd) and
reduces the per-channel parameter gradients in per-program fp32 partial buffers.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from megatron_zaya.kernels._triton_common import (PRUNE, next_pow2, num_programs_hint, num_warps_configs,
                                                rows_2d)


@triton.autotune(configs=num_warps_configs(), key=["BLOCK_D", "HAS_RESIDUAL", "HAS_NORM"], prune_configs_by=PRUNE)
@triton.jit
def _fwd_kernel(
    out_ptr, res_ptr, os_ptr, ob_ptr, rs_ptr, rb_ptr, w_ptr,
    newres_ptr, normed_ptr, rstd_ptr,
    D, stride_out, stride_res, stride_newres, stride_normed, eps,
    HAS_RESIDUAL: tl.constexpr, HAS_NORM: tl.constexpr, BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    if HAS_RESIDUAL:
        o = tl.load(out_ptr + row * stride_out + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0).to(tl.float32)
        o_scale = tl.load(os_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        o_bias = tl.load(ob_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        r_scale = tl.load(rs_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        r_bias = tl.load(rb_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        x = (o + o_bias) * o_scale + (r + r_bias) * r_scale
        x_store = x.to(newres_ptr.dtype.element_ty)
        tl.store(newres_ptr + row * stride_newres + cols, x_store, mask=mask)
        x = x_store.to(tl.float32)  # the norm sees the stored (rounded) residual, as the reference does
        x_dtype = newres_ptr.dtype.element_ty
    else:
        x = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0).to(tl.float32)
        x_dtype = res_ptr.dtype.element_ty
    if HAS_NORM:
        mean_sq = tl.sum(x * x, axis=0) / D
        rstd = 1.0 / tl.sqrt(mean_sq + eps)
        tl.store(rstd_ptr + row, rstd)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        x_hat = (x * rstd).to(x_dtype).to(tl.float32)
        y = w * x_hat
        tl.store(normed_ptr + row * stride_normed + cols, y.to(normed_ptr.dtype.element_ty), mask=mask)


@triton.autotune(configs=num_warps_configs(), key=["BLOCK_D", "HAS_RESIDUAL", "HAS_NORM", "HAS_DRES"],
                 prune_configs_by=PRUNE)
@triton.jit
def _bwd_kernel(
    out_ptr, res_ptr, os_ptr, ob_ptr, rs_ptr, rb_ptr, w_ptr, rstd_ptr,
    dnormed_ptr, dnewres_ptr,
    dout_ptr, dres_ptr,
    pw_ptr, pos_ptr, pob_ptr, prs_ptr, prb_ptr,
    n_rows, rows_per_program, D,
    stride_out, stride_res, stride_dnormed, stride_dnewres, stride_dout, stride_dres,
    HAS_RESIDUAL: tl.constexpr, HAS_NORM: tl.constexpr, HAS_DRES: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    acc_w = tl.zeros((BLOCK_D,), tl.float32)
    acc_os = tl.zeros((BLOCK_D,), tl.float32)
    acc_ob = tl.zeros((BLOCK_D,), tl.float32)
    acc_rs = tl.zeros((BLOCK_D,), tl.float32)
    acc_rb = tl.zeros((BLOCK_D,), tl.float32)
    if HAS_NORM:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        o_scale = tl.load(os_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        o_bias = tl.load(ob_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        r_scale = tl.load(rs_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        r_bias = tl.load(rb_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    for row in range(row_start, row_end):
        row64 = row
        if HAS_RESIDUAL:
            a = tl.load(out_ptr + row64 * stride_out + cols, mask=mask, other=0.0).to(tl.float32) + o_bias
            b = tl.load(res_ptr + row64 * stride_res + cols, mask=mask, other=0.0).to(tl.float32) + r_bias
            x = (a * o_scale + b * r_scale).to(dres_ptr.dtype.element_ty).to(tl.float32)
            x_dtype = dres_ptr.dtype.element_ty
        else:
            x = tl.load(res_ptr + row64 * stride_res + cols, mask=mask, other=0.0).to(tl.float32)
            x_dtype = dres_ptr.dtype.element_ty
        dx = tl.zeros((BLOCK_D,), tl.float32)
        if HAS_NORM:
            rstd = tl.load(rstd_ptr + row64)
            g = tl.load(dnormed_ptr + row64 * stride_dnormed + cols, mask=mask, other=0.0).to(tl.float32)
            x_hat = x * rstd
            acc_w += g * x_hat.to(x_dtype).to(tl.float32)
            wg = w * g
            dx = rstd * (wg - x_hat * (tl.sum(wg * x_hat, axis=0) / D))
        if HAS_DRES:
            dx += tl.load(dnewres_ptr + row64 * stride_dnewres + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            tl.store(dout_ptr + row64 * stride_dout + cols, (dx * o_scale).to(dout_ptr.dtype.element_ty), mask=mask)
            tl.store(dres_ptr + row64 * stride_dres + cols, (dx * r_scale).to(dres_ptr.dtype.element_ty), mask=mask)
            acc_os += dx * a
            acc_ob += dx
            acc_rs += dx * b
            acc_rb += dx
        else:
            tl.store(dres_ptr + row64 * stride_dres + cols, dx.to(dres_ptr.dtype.element_ty), mask=mask)
    part = pid.to(tl.int64) * D + cols
    if HAS_NORM:
        tl.store(pw_ptr + part, acc_w, mask=mask)
    if HAS_RESIDUAL:
        tl.store(pos_ptr + part, acc_os, mask=mask)
        tl.store(pob_ptr + part, acc_ob, mask=mask)
        tl.store(prs_ptr + part, acc_rs, mask=mask)
        tl.store(prb_ptr + part, acc_rb, mask=mask)


def _vec(p: torch.Tensor, d: int) -> torch.Tensor:
    """A per-channel parameter (broadcastable to (d,)) as a contiguous (d,) tensor."""
    return p.expand(d).contiguous() if p.shape != (d,) else p.contiguous()


def _grad_like(partial_sum: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    return partial_sum.sum_to_size(p.shape).to(p.dtype)


def _forward(out, residual, scales, weight, eps, newres_dtype, normed_dtype, has_residual, has_norm):
    x2 = rows_2d(residual)
    n, d = x2.shape
    o2 = rows_2d(out) if has_residual else x2
    dummy = x2
    sc = [_vec(s, d) for s in scales] if has_residual else [dummy] * 4
    w = _vec(weight, d) if has_norm else dummy
    newres = torch.empty((n, d), dtype=newres_dtype, device=x2.device) if has_residual else x2
    normed = torch.empty((n, d), dtype=normed_dtype, device=x2.device) if has_norm else x2
    rstd = torch.empty((n,), dtype=torch.float32, device=x2.device)
    if n > 0:
        _fwd_kernel[(n,)](
            o2, x2, *sc, w, newres, normed, rstd,
            d, o2.stride(0), x2.stride(0), newres.stride(0), normed.stride(0), float(eps),
            HAS_RESIDUAL=has_residual, HAS_NORM=has_norm, BLOCK_D=next_pow2(d),
        )
    return newres, normed, rstd


def _backward(out, residual, scales, weight, rstd, dnormed, dnewres, has_residual, has_norm, x_dtype):
    x2 = rows_2d(residual)
    n, d = x2.shape
    o2 = rows_2d(out) if has_residual else x2
    dummy = x2
    sc = [_vec(s, d) for s in scales] if has_residual else [dummy] * 4
    w = _vec(weight, d) if has_norm else dummy
    gn = rows_2d(dnormed) if dnormed is not None else dummy
    gr = rows_2d(dnewres) if dnewres is not None else dummy
    rstd = rstd if rstd is not None else x2.new_empty((1,), dtype=torch.float32)
    dres = torch.empty((n, d), dtype=x_dtype, device=x2.device)
    dout = torch.empty((n, d), dtype=out.dtype, device=x2.device) if has_residual else dres
    programs = max(1, min(n, num_programs_hint(x2.device)))
    rows_per_program = triton.cdiv(max(n, 1), programs)
    partials = torch.zeros((5, programs, d), dtype=torch.float32, device=x2.device)
    if n > 0:
        _bwd_kernel[(programs,)](
            o2, x2, *sc, w, rstd, gn, gr, dout, dres, *partials,
            n, rows_per_program, d,
            o2.stride(0), x2.stride(0), gn.stride(0), gr.stride(0), dout.stride(0), dres.stride(0),
            HAS_RESIDUAL=has_residual, HAS_NORM=has_norm and dnormed is not None,
            HAS_DRES=dnewres is not None, BLOCK_D=next_pow2(d),
        )
    sums = partials.sum(1)
    return dout, dres, sums


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        out_dtype = torch.promote_types(x.dtype, weight.dtype)
        _, normed, rstd = _forward(None, x, None, weight, eps, None, out_dtype, False, True)
        ctx.save_for_backward(x, weight, rstd)
        return normed.view(x.shape)

    @staticmethod
    def backward(ctx, g):
        x, weight, rstd = ctx.saved_tensors
        _, dx, sums = _backward(None, x, None, weight, rstd, g, None, False, True, x.dtype)
        return dx.view(x.shape), _grad_like(sums[0], weight), None


class _ResidualRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out, residual, out_scale, out_bias, res_scale, res_bias, weight, eps, norm_dtype):
        scales = (out_scale, out_bias, res_scale, res_bias)
        normed_dtype = torch.promote_types(residual.dtype, weight.dtype) if norm_dtype is None else norm_dtype
        newres, normed, rstd = _forward(out, residual, scales, weight, eps, residual.dtype, normed_dtype, True, True)
        ctx.save_for_backward(out, residual, *scales, weight, rstd)
        return newres.view(residual.shape), normed.view(residual.shape)

    @staticmethod
    def backward(ctx, dnewres, dnormed):
        out, residual, *scales, weight, rstd = ctx.saved_tensors
        dout, dres, sums = _backward(out, residual, scales, weight, rstd, dnormed, dnewres, True, True, residual.dtype)
        os_, ob, rs, rb = scales
        grads = (
            _grad_like(sums[1], os_),
            _grad_like(sums[2] * _vec(os_, sums.shape[1]).float(), ob),
            _grad_like(sums[3], rs),
            _grad_like(sums[4] * _vec(rs, sums.shape[1]).float(), rb),
        )
        return (dout.view(out.shape), dres.view(residual.shape), *grads, _grad_like(sums[0], weight), None, None)


class _ScaledResidualAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out, residual, out_scale, out_bias, res_scale, res_bias):
        scales = (out_scale, out_bias, res_scale, res_bias)
        newres, _, _ = _forward(out, residual, scales, None, 0.0, residual.dtype, None, True, False)
        ctx.save_for_backward(out, residual, *scales)
        return newres.view(residual.shape)

    @staticmethod
    def backward(ctx, dnewres):
        out, residual, *scales = ctx.saved_tensors
        dout, dres, sums = _backward(out, residual, scales, None, None, None, dnewres, True, False, residual.dtype)
        os_, ob, rs, rb = scales
        grads = (
            _grad_like(sums[1], os_),
            _grad_like(sums[2] * _vec(os_, sums.shape[1]).float(), ob),
            _grad_like(sums[3], rs),
            _grad_like(sums[4] * _vec(rs, sums.shape[1]).float(), rb),
        )
        return (dout.view(out.shape), dres.view(residual.shape), *grads)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _RMSNorm.apply(x, weight, eps)


def scaled_residual_add(out, residual, out_scale, out_bias, res_scale, res_bias) -> torch.Tensor:
    return _ScaledResidualAdd.apply(out, residual, out_scale, out_bias, res_scale, res_bias)


def scaled_residual_add_rms_norm(
    out, residual, out_scale, out_bias, res_scale, res_bias, norm_weight, eps, norm_dtype=None
) -> tuple[torch.Tensor, torch.Tensor]:
    return _ResidualRMSNorm.apply(out, residual, out_scale, out_bias, res_scale, res_bias, norm_weight, eps, norm_dtype)
