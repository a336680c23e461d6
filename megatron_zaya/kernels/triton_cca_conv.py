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

Packed documents (cca_causal_conv_segmented): a (B, S, lags) visibility says whether step t may see
step t - l. The depthwise sum of step u drops the inputs u may not see, and a grouped-conv tap at
lag l that step t may not see reads the depthwise bias instead of y1[t - l] (as at a sequence start;
reference.cca_causal_conv_segmented). Both kernels take the visibility as masks on what they load,
so a document boundary costs no extra pass.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from megatron_zaya.kernels._triton_common import PRUNE, configs, dot_acc


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


@triton.jit
def _visible(vis_ptr, b, t, lag, S, sv_b, sv_s, sv_l):
    """(BT,) bool: step t may see step t - lag (lag >= 1); False for t outside [0, S)."""
    ok = (t >= 0) & (t < S)
    t_ok = tl.where(ok, t, 0).to(tl.int64)
    return tl.load(vis_ptr + b * sv_b + t_ok * sv_s + (lag - 1) * sv_l, mask=ok, other=0) != 0


_CONFIGS = configs(
    # Spill-free on gfx942 (MI300X) and sm_90 (H100/H200) for dh = 128 in every specialisation (compile_check
    # --all-configs). A 32 x 128 x 32 tile on 8 warps spilled up to 1 KB per thread in the backward on gfx942,
    # where 8 wavefronts leave each lane 256 registers; 16 x 128 x 32 on 4 warps still covers a whole group's
    # 128 channels per program. 64 x 64 x 32 spilled 64 B per thread in the forward with left context on sm_90.
    # (Measured with Triton 3.9. Under Triton 3.6 the 16 x 128 x 32 forward spills 32-120 B per thread on sm_90;
    # autotuning then picks among the other configs by time.)
    [triton.Config({"BT": bt, "BO": bo, "BK": bk}, num_warps=w)
     for bt, bo, bk, w in ((32, 64, 16, 4), (64, 64, 16, 8), (16, 128, 32, 4))],
    triton.Config({"BT": 16, "BO": 16, "BK": 16}, num_warps=1),
)


@triton.autotune(configs=_CONFIGS, key=["DH", "K1", "K2", "HAS_LEFT", "HAS_VIS"], prune_configs_by=PRUNE)
@triton.jit
def _fwd_kernel(
    p_ptr, left_ptr, vis_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, out_ptr,
    S, DH, L,
    sp_b, sp_s, sl_b, sl_c, sl_t, sv_b, sv_s, sv_l, sw1_c, sw1_k, sw2_o, sw2_i, sw2_k, so_b, so_s,
    K1: tl.constexpr, K2: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_VIS: tl.constexpr, BT: tl.constexpr,
    BO: tl.constexpr, BK: tl.constexpr,
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
                x = _load_x_pad(p_ptr, left_ptr, b, t + k + kp, chans, cmask, S, L,
                                sp_b, sp_s, sl_b, sl_c, sl_t, HAS_LEFT)
                if HAS_VIS and K1 - 1 - kp > 0:   # y1's step t - (K2-1-k) sees its input K1-1-kp steps back?
                    x = tl.where(_visible(vis_ptr, b, t - (K2 - 1 - k), K1 - 1 - kp, S, sv_b, sv_s, sv_l)[:, None], x, 0.0)
                y1 += w[None, :] * x
            if HAS_VIS and K2 - 1 - k > 0:        # a tap step t may not see reads the depthwise bias
                y1 = tl.where(_visible(vis_ptr, b, t, K2 - 1 - k, S, sv_b, sv_s, sv_l)[:, None], y1, b1[None, :])
            # W2_k^T chunk (BK, BO): element [i, o] = g_weight[grp * dh + co[o], ci[i], k]
            w2t = tl.load(w2_ptr + out_chans[None, :] * sw2_o + ci[:, None] * sw2_i + k * sw2_k,
                          mask=cmask[:, None] & omask_c[None, :], other=0.0)
            acc = dot_acc(y1, w2t, acc, p_ptr)
    acc += tl.load(b2_ptr + out_chans, mask=omask_c, other=0.0).to(tl.float32)[None, :]
    omask = (t < S)[:, None] & omask_c[None, :]
    tl.store(out_ptr + b * so_b + t[:, None].to(tl.int64) * so_s + out_chans[None, :], acc.to(out_ptr.dtype.element_ty), mask=omask)


@triton.autotune(configs=_CONFIGS, key=["DH", "K1", "K2", "HAS_LEFT", "HAS_VIS"], prune_configs_by=PRUNE)
@triton.jit
def _bwd_kernel(
    g_ptr, vis_ptr, w1_ptr, w2_ptr, dp_ptr, dleft_ptr, dy1_ptr,
    S, DH, L,
    sg_b, sg_s, sv_b, sv_s, sv_l, sw1_c, sw1_k, sw2_o, sw2_i, sw2_k, sdp_b, sdp_s, sdl_b, sdl_c, sdl_t, sdy_b, sdy_s,
    K1: tl.constexpr, K2: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_VIS: tl.constexpr, BT: tl.constexpr,
    BO: tl.constexpr, BK: tl.constexpr,
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
                if HAS_VIS and K2 - 1 - k > 0:    # only the outputs that see this tap
                    valid = valid & _visible(vis_ptr, b, tt, K2 - 1 - k, S, sv_b, sv_s, sv_l)
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
        if HAS_VIS and K1 - 1 - kp > 0:           # only the depthwise steps that see this input
            dy1 = tl.where(_visible(vis_ptr, b, j - kp - (K2 - 1), K1 - 1 - kp, S, sv_b, sv_s, sv_l)[:, None], dy1, 0.0)
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
    n = b.shape[-1]         # sizes written out: a -1 cannot be inferred when there are no rows
    b_chunks = b.reshape(splits, chunk, groups, n).permute(2, 0, 1, 3).reshape(groups * splits, chunk, n)
    return torch.bmm(a_chunks, b_chunks).reshape(groups, splits, m, n).sum(1)


def _unit_channels(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _visibility_arg(visible, like):
    """The kernels' view of `visible` (bytes, no copy) and its strides; `like` and zero strides without one."""
    if visible is None:
        return like, (0, 0, 0)
    vis = visible.view(torch.uint8) if visible.dtype == torch.bool else visible
    return vis, (vis.stride(0), vis.stride(1), vis.stride(2))


def _check_shapes(packed, w1, w2, visible):
    bsz, seq, chans = packed.shape
    k1, k2 = w1.shape[-1], w2.shape[-1]
    dh = w2.shape[1]
    if w1.shape != (chans, 1, k1) or w2.shape != (chans, dh, k2) or chans % dh:
        raise ValueError("cca_causal_conv: expected dw_weight (C, 1, K1) and g_weight (C, C // groups, K2)")
    if visible is not None and (visible.shape[:2] != (bsz, seq) or visible.shape[2] < max(k1, k2) - 1):
        raise ValueError(f"cca_causal_conv_segmented: visible must be (B, S, >= {max(k1, k2) - 1}) = "
                         f"({bsz}, {seq}, ...), got {tuple(visible.shape)}")
    return bsz, seq, chans, k1, k2, dh, chans // dh, k1 - 1 + k2 - 1


class _CCAConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, packed, w1, b1, w2, b2, left, visible):
        bsz, seq, chans, k1, k2, dh, groups, ctx_len = _check_shapes(packed, w1, w2, visible)
        packed = _unit_channels(packed)
        out = torch.empty((bsz, seq, chans), dtype=packed.dtype, device=packed.device)
        lf = left if left is not None else packed
        vis, sv = _visibility_arg(visible, packed)
        if bsz * seq:
            grid = lambda meta: (triton.cdiv(seq, meta["BT"]), groups * triton.cdiv(dh, meta["BO"]), bsz)  # noqa: E731
            _fwd_kernel[grid](
                packed, lf, vis, w1, b1, w2, b2, out, seq, dh, ctx_len,
                packed.stride(0), packed.stride(1), lf.stride(0), lf.stride(1), lf.stride(-1), *sv,
                w1.stride(0), w1.stride(2), w2.stride(0), w2.stride(1), w2.stride(2), out.stride(0), out.stride(1),
                K1=k1, K2=k2, HAS_LEFT=left is not None, HAS_VIS=visible is not None,
            )
        none = torch.empty(0)
        ctx.save_for_backward(packed, w1, b1, w2, b2, none if left is None else left, none if visible is None else visible)
        ctx.has_left, ctx.has_visible = left is not None, visible is not None
        return out

    @staticmethod
    def backward(ctx, grad):
        packed, w1, b1, w2, b2, left, visible = ctx.saved_tensors
        left = left if ctx.has_left else None
        visible = visible if ctx.has_visible else None
        bsz, seq, chans, k1, k2, dh, groups, ctx_len = _check_shapes(packed, w1, w2, visible)
        grad = _unit_channels(grad)
        d_packed = torch.empty_like(packed)
        alloc = torch.empty if bsz * seq else torch.zeros      # no launch for an empty sequence: zero gradients
        d_left = alloc(left.shape, dtype=left.dtype, device=left.device) if left is not None else d_packed
        dy1 = alloc((bsz, seq + ctx_len, chans), dtype=torch.float32, device=packed.device)
        vis, sv = _visibility_arg(visible, grad)
        if bsz * seq:
            grid = lambda meta: (triton.cdiv(seq + ctx_len, meta["BT"]), groups * triton.cdiv(dh, meta["BO"]), bsz)  # noqa: E731
            _bwd_kernel[grid](
                grad, vis, w1, w2, d_packed, d_left, dy1, seq, dh, ctx_len,
                grad.stride(0), grad.stride(1), *sv, w1.stride(0), w1.stride(2), w2.stride(0), w2.stride(1), w2.stride(2),
                d_packed.stride(0), d_packed.stride(1), d_left.stride(0), d_left.stride(1), d_left.stride(-1),
                dy1.stride(0), dy1.stride(1),
                K1=k1, K2=k2, HAS_LEFT=left is not None, HAS_VIS=visible is not None,
            )
        # Weight gradients: reductions over (B, S) in fp32 with torch.
        n1 = seq + k2 - 1  # length of the depthwise output y1, from step -(K2 - 1)
        x_pad = packed.float()
        head = left.transpose(1, 2).float() if left is not None else x_pad.new_zeros(bsz, ctx_len, chans)
        x_pad = torch.cat((head, x_pad), dim=1)
        dy1 = dy1[:, :n1]
        # y1's inputs per depthwise tap kp (lag K1 - 1 - kp), without those its step may not see.
        y1_sees = None if visible is None else torch.cat((visible.new_zeros(bsz, k2 - 1, visible.shape[2]), visible), 1)
        inputs = [x_pad[:, kp:kp + n1] if y1_sees is None or kp == k1 - 1 else
                  x_pad[:, kp:kp + n1] * y1_sees[..., k1 - 2 - kp:k1 - 1 - kp] for kp in range(k1)]
        y1 = b1.float() + sum(w1[:, 0, kp].float() * inputs[kp] for kp in range(k1))
        d_w1 = torch.stack([(dy1 * inputs[kp]).sum((0, 1)) for kp in range(k1)], dim=-1).unsqueeze(1)
        g_rows = grad.float().reshape(bsz * seq, groups, dh)
        d_b2 = g_rows.sum(0).reshape(chans)
        if visible is None:
            d_b1 = dy1.sum((0, 1))
        else:   # every tap of every output holds b1 once, through y1 or in its place: sum_k W2_k^T sum_t g[t]
            d_b1 = torch.einsum("goik,go->gi", w2.float().view(groups, dh, dh, k2), d_b2.view(groups, dh)).reshape(chans)

        def tap(k):     # what output t reads at grouped tap k (lag K2 - 1 - k)
            taps = y1[:, k:k + seq]
            if visible is not None and k < k2 - 1:
                taps = torch.where(visible[..., k2 - 2 - k:k2 - 1 - k], taps, b1.float())
            return taps.reshape(bsz * seq, groups, dh)

        d_w2 = torch.stack([grouped_row_products(g_rows, tap(k)).reshape(chans, dh) for k in range(k2)], dim=-1)
        return (d_packed, d_w1.to(w1.dtype), d_b1.to(b1.dtype), d_w2.to(w2.dtype), d_b2.to(b2.dtype),
                d_left if left is not None else None, None)


def cca_causal_conv(packed, dw_weight, dw_bias, g_weight, g_bias, left=None) -> torch.Tensor:
    return _CCAConv.apply(packed, dw_weight, dw_bias, g_weight, g_bias, left, None)


def cca_causal_conv_segmented(packed, dw_weight, dw_bias, g_weight, g_bias, visible) -> torch.Tensor:
    """reference.cca_causal_conv_segmented: visible (B, S, lags) bool, step t sees step t - l."""
    return _CCAConv.apply(packed, dw_weight, dw_bias, g_weight, g_bias, None, visible)
