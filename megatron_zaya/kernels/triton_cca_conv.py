"""CCA causal convolution pair (depthwise kernel K1, then grouped kernel K2) fused (Triton).

Layout: packed (B, S, C) channel-last, C = groups * dh; x_pad is packed preceded in time by
L = K1 - 1 + K2 - 1 steps of `left` context (or zeros). With times in padded coordinates,
    y1[u] = b1 + sum_{k' < K1} w1[k'] * x_pad[u + k']                  (depthwise, per channel)
    out[t] = b2 + sum_{k < K2} W2_k[group] @ y1[t + k]                  (dense dh x dh per group)
The forward reads packed once and writes out once: y1 is recomputed in registers for each of
the K2 taps and the per-group mixing is a tl.dot. The backward kernel computes
    dy1[u]   = sum_k W2_k^T g[u - k]
    dx_pad[j] = sum_{k'} w1[k'] * dy1[j - k']
in one pass (d packed and d left), and also writes dy1 for the weight gradients, which are
reductions over (B, S) done with torch matmuls / sums in fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from megatron_zaya.kernels._triton_common import configs, dot_acc


@triton.jit
def _load_x_pad(p_ptr, left_ptr, b, tau, chans, cmask, S, L, sp_b, sp_s, sl_b, sl_c, sl_t, HAS_LEFT: tl.constexpr):
    """Rows tau (padded time) of x_pad for channels chans, in fp32; zeros outside [0, S + L)."""
    in_p = (tau >= L) & (tau < S + L)
    t_p = tl.where(in_p, tau - L, 0).to(tl.int64)
    v = tl.load(p_ptr + b * sp_b + t_p[:, None] * sp_s + chans[None, :], mask=in_p[:, None] & cmask[None, :], other=0.0)
    v = v.to(tl.float32)
    if HAS_LEFT:
        in_l = (tau >= 0) & (tau < L)
        t_l = tl.where(in_l, tau, 0).to(tl.int64)
        v += tl.load(left_ptr + b * sl_b + chans[None, :] * sl_c + t_l[:, None] * sl_t,
                     mask=in_l[:, None] & cmask[None, :], other=0.0).to(tl.float32)
    return v


_CONFIGS = configs(
    # Spill-free on sm_90 for dh = 128 (ptxas -v): 146, 196 and 206 registers per thread.
    [triton.Config({"BT": bt, "BO": bo, "BK": bk}, num_warps=w) for bt, bo, bk, w in ((32, 64, 16, 4), (64, 64, 32, 8), (32, 128, 32, 8))],
    triton.Config({"BT": 16, "BO": 16, "BK": 16}, num_warps=1),
)


@triton.autotune(configs=_CONFIGS, key=["DH", "K1", "K2", "HAS_LEFT"])
@triton.jit
def _fwd_kernel(
    p_ptr, left_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, out_ptr,
    S, DH, L,
    sp_b, sp_s, sl_b, sl_c, sl_t, sw1_c, sw1_k, sw2_o, sw2_i, sw2_k, so_b, so_s,
    K1: tl.constexpr, K2: tl.constexpr, HAS_LEFT: tl.constexpr, BT: tl.constexpr, BO: tl.constexpr,
    BK: tl.constexpr,
):
    """Program (time tile, group x block of BO output channels, batch); the contraction over the
    group's input channels runs in chunks of BK, recomputing the depthwise output per chunk."""
    pid_t = tl.program_id(0)
    n_ob = tl.cdiv(DH, BO)
    grp = tl.program_id(1) // n_ob
    co = (tl.program_id(1) % n_ob) * BO + tl.arange(0, BO)
    omask_c = co < DH
    out_chans = grp * DH + co
    b = tl.program_id(2).to(tl.int64)
    t = pid_t * BT + tl.arange(0, BT)
    acc = tl.zeros((BT, BO), tl.float32)
    for kc in range(0, DH, BK):
        ci = kc + tl.arange(0, BK)
        cmask = ci < DH
        chans = grp * DH + ci
        b1 = tl.load(b1_ptr + chans, mask=cmask, other=0.0).to(tl.float32)
        for k in tl.static_range(K2):
            y1 = tl.zeros((BT, BK), tl.float32) + b1[None, :]
            for kp in tl.static_range(K1):
                w = tl.load(w1_ptr + chans * sw1_c + kp * sw1_k, mask=cmask, other=0.0).to(tl.float32)
                y1 += w[None, :] * _load_x_pad(p_ptr, left_ptr, b, t + k + kp, chans, cmask, S, L,
                                               sp_b, sp_s, sl_b, sl_c, sl_t, HAS_LEFT)
            # W2_k^T chunk (BK, BO): element [i, o] = g_weight[grp * dh + co[o], ci[i], k]
            w2t = tl.load(w2_ptr + out_chans[None, :] * sw2_o + ci[:, None] * sw2_i + k * sw2_k,
                          mask=cmask[:, None] & omask_c[None, :], other=0.0)
            acc = dot_acc(y1, w2t, acc, p_ptr)
    acc += tl.load(b2_ptr + out_chans, mask=omask_c, other=0.0).to(tl.float32)[None, :]
    omask = (t < S)[:, None] & omask_c[None, :]
    tl.store(out_ptr + b * so_b + t[:, None].to(tl.int64) * so_s + out_chans[None, :], acc.to(out_ptr.dtype.element_ty), mask=omask)


@triton.autotune(configs=_CONFIGS, key=["DH", "K1", "K2", "HAS_LEFT"])
@triton.jit
def _bwd_kernel(
    g_ptr, w1_ptr, w2_ptr, dp_ptr, dleft_ptr, dy1_ptr,
    S, DH, L,
    sg_b, sg_s, sw1_c, sw1_k, sw2_o, sw2_i, sw2_k, sdp_b, sdp_s, sdl_b, sdl_c, sdl_t, sdy_b, sdy_s,
    K1: tl.constexpr, K2: tl.constexpr, HAS_LEFT: tl.constexpr, BT: tl.constexpr, BO: tl.constexpr,
    BK: tl.constexpr,
):
    """Program (padded-time tile, group x block of BO input channels, batch); the contraction over
    the group's output channels runs in chunks of BK."""
    pid_t = tl.program_id(0)
    n_ib = tl.cdiv(DH, BO)
    grp = tl.program_id(1) // n_ib
    ci = (tl.program_id(1) % n_ib) * BO + tl.arange(0, BO)  # this program's input channels
    imask = ci < DH
    in_chans = grp * DH + ci
    b = tl.program_id(2).to(tl.int64)
    j = pid_t * BT + tl.arange(0, BT)  # padded time in [0, S + L)
    dx = tl.zeros((BT, BO), tl.float32)
    for kp in tl.static_range(K1):
        dy1 = tl.zeros((BT, BO), tl.float32)
        for kc in range(0, DH, BK):
            co = kc + tl.arange(0, BK)
            cmask = co < DH
            chans = grp * DH + co
            for k in tl.static_range(K2):
                tt = j - kp - k
                valid = (tt >= 0) & (tt < S)
                t_safe = tl.where(valid, tt, 0).to(tl.int64)
                gt = tl.load(g_ptr + b * sg_b + t_safe[:, None] * sg_s + chans[None, :],
                             mask=valid[:, None] & cmask[None, :], other=0.0)
                # W2_k chunk (BK, BO): element [o, i] = g_weight[grp * dh + co[o], ci[i], k]
                w2 = tl.load(w2_ptr + chans[:, None] * sw2_o + ci[None, :] * sw2_i + k * sw2_k,
                             mask=cmask[:, None] & imask[None, :], other=0.0)
                dy1 = dot_acc(gt, w2, dy1, g_ptr)
        if kp == 0:
            ymask = (j < S + L)[:, None] & imask[None, :]
            tl.store(dy1_ptr + b * sdy_b + j[:, None].to(tl.int64) * sdy_s + in_chans[None, :], dy1, mask=ymask)
        w = tl.load(w1_ptr + in_chans * sw1_c + kp * sw1_k, mask=imask, other=0.0).to(tl.float32)
        dx += w[None, :] * dy1
    in_p = (j >= L) & (j < S + L)
    t_p = tl.where(in_p, j - L, 0).to(tl.int64)
    tl.store(dp_ptr + b * sdp_b + t_p[:, None] * sdp_s + in_chans[None, :], dx.to(dp_ptr.dtype.element_ty),
             mask=in_p[:, None] & imask[None, :])
    if HAS_LEFT:
        in_l = j < L
        t_l = tl.where(in_l, j, 0).to(tl.int64)
        tl.store(dleft_ptr + b * sdl_b + in_chans[None, :] * sdl_c + t_l[:, None] * sdl_t, dx.to(dleft_ptr.dtype.element_ty),
                 mask=in_l[:, None] & imask[None, :])


def row_splits(rows: int, min_rows_per_split: int = 256, max_splits: int = 16) -> int:
    """The largest power of two up to max_splits that divides `rows` into chunks of at least
    min_rows_per_split rows (1 when none does)."""
    splits = max_splits
    while splits > 1 and (rows % splits or rows // splits < min_rows_per_split):
        splits //= 2
    return splits


def grouped_row_products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum over rows r of a[r, g]^T b[r, g], per group g: a (R, G, M), b (R, G, N) -> (G, M, N).

    The rows are cut into P = row_splits(R) equal chunks, multiplied as one batch of G * P products
    and summed over P.
    A plain bmm over the G groups makes only G output tiles of M x N (10 for ZAYA1's CCA), each
    reducing all R = B * S rows alone, which leaves most of a GPU's multiprocessors idle."""
    rows, groups, m = a.shape
    splits = row_splits(rows)
    chunk = rows // splits
    a_chunks = a.reshape(splits, chunk, groups, m).permute(2, 0, 3, 1).reshape(groups * splits, m, chunk)
    b_chunks = b.reshape(splits, chunk, groups, b.shape[-1]).permute(2, 0, 1, 3).reshape(groups * splits, chunk, -1)
    return torch.bmm(a_chunks, b_chunks).reshape(groups, splits, m, -1).sum(1)


def _unit_channels(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


class _CCAConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, packed, w1, b1, w2, b2, left):
        bsz, seq, chans = packed.shape
        k1, k2 = w1.shape[-1], w2.shape[-1]
        dh = w2.shape[1]
        groups = chans // dh
        ctx_len = k1 - 1 + k2 - 1
        if w1.shape != (chans, 1, k1) or w2.shape != (chans, dh, k2) or groups * dh != chans:
            raise ValueError("cca_causal_conv: expected dw_weight (C, 1, K1) and g_weight (C, C // groups, K2)")
        packed = _unit_channels(packed)
        out = torch.empty((bsz, seq, chans), dtype=packed.dtype, device=packed.device)
        lf = left if left is not None else packed
        if bsz * seq:
            grid = lambda meta: (triton.cdiv(seq, meta["BT"]), groups * triton.cdiv(dh, meta["BO"]), bsz)  # noqa: E731
            _fwd_kernel[grid](
                packed, lf, w1, b1, w2, b2, out, seq, dh, ctx_len,
                packed.stride(0), packed.stride(1), lf.stride(0), lf.stride(1), lf.stride(-1),
                w1.stride(0), w1.stride(2), w2.stride(0), w2.stride(1), w2.stride(2), out.stride(0), out.stride(1),
                K1=k1, K2=k2, HAS_LEFT=left is not None,
            )
        ctx.save_for_backward(packed, w1, b1, w2, b2, left if left is not None else torch.empty(0))
        ctx.has_left = left is not None
        return out

    @staticmethod
    def backward(ctx, grad):
        packed, w1, b1, w2, b2, left = ctx.saved_tensors
        left = left if ctx.has_left else None
        bsz, seq, chans = packed.shape
        k1, k2 = w1.shape[-1], w2.shape[-1]
        dh = w2.shape[1]
        groups = chans // dh
        ctx_len = k1 - 1 + k2 - 1
        grad = _unit_channels(grad)
        d_packed = torch.empty_like(packed)
        d_left = torch.empty(left.shape, dtype=left.dtype, device=left.device) if left is not None else d_packed
        dy1 = torch.empty((bsz, seq + ctx_len, chans), dtype=torch.float32, device=packed.device)
        if bsz * seq:
            grid = lambda meta: (triton.cdiv(seq + ctx_len, meta["BT"]), groups * triton.cdiv(dh, meta["BO"]), bsz)  # noqa: E731
            _bwd_kernel[grid](
                grad, w1, w2, d_packed, d_left, dy1, seq, dh, ctx_len,
                grad.stride(0), grad.stride(1), w1.stride(0), w1.stride(2), w2.stride(0), w2.stride(1), w2.stride(2),
                d_packed.stride(0), d_packed.stride(1), d_left.stride(0), d_left.stride(1), d_left.stride(-1),
                dy1.stride(0), dy1.stride(1),
                K1=k1, K2=k2, HAS_LEFT=left is not None,
            )
        # Weight gradients: reductions over (B, S) in fp32 with torch.
        n1 = seq + k2 - 1  # length of the depthwise output
        x_pad = packed.float()
        head = left.transpose(1, 2).float() if left is not None else x_pad.new_zeros(bsz, ctx_len, chans)
        x_pad = torch.cat((head, x_pad), dim=1)
        dy1 = dy1[:, :n1]
        y1 = b1.float() + sum(w1[:, 0, kp].float() * x_pad[:, kp:kp + n1] for kp in range(k1))
        d_w1 = torch.stack([(dy1 * x_pad[:, kp:kp + n1]).sum((0, 1)) for kp in range(k1)], dim=-1).unsqueeze(1)
        d_b1 = dy1.sum((0, 1))
        g_rows = grad.float().reshape(bsz * seq, groups, dh)
        d_w2 = torch.stack([
            grouped_row_products(g_rows, y1[:, k:k + seq].reshape(bsz * seq, groups, dh)).reshape(chans, dh)
            for k in range(k2)
        ], dim=-1)
        d_b2 = g_rows.sum(0).reshape(chans)
        return (d_packed, d_w1.to(w1.dtype), d_b1.to(b1.dtype), d_w2.to(w2.dtype), d_b2.to(b2.dtype),
                d_left if left is not None else None)


def cca_causal_conv(packed, dw_weight, dw_bias, g_weight, g_bias, left=None) -> torch.Tensor:
    return _CCAConv.apply(packed, dw_weight, dw_bias, g_weight, g_bias, left)
