"""Benchmark and check the fused kernels of megatron_zaya.kernels against the eager reference.

On a GPU (CUDA or ROCm): for each kernel, at ZAYA1-like shapes, check the Triton output against
reference.py once, then time the Triton kernel and the eager PyTorch reference (median of many
runs timed with device events) and print the achieved bandwidth of the Triton kernel (the
minimum bytes it must move / its time) next to the device's measured copy bandwidth
(2 x bytes of a large `dst.copy_(src)` / its time). Newton-Schulz is compute-bound: TFLOP/s.

On a machine without a GPU it runs the Triton interpreter check only: every kernel, forward and
backward, on small ragged shapes against the reference (TRITON_INTERPRET=1 is set before triton
is imported), printing the max error and tolerance of each output and gradient.

    python bench/kernels.py                 # all kernels
    python bench/kernels.py --only cross_entropy,rope  # a subset (names: see --list)
    python bench/kernels.py --reps 200 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

GPU = torch.cuda.is_available()
if not GPU:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first `import triton`

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from megatron_zaya.kernels import reference as R  # noqa: E402
from megatron_zaya.kernels import (  # noqa: E402
    ce_autograd,
    triton_cca_conv,
    triton_cross_entropy,
    triton_moe_permute,
    triton_newton_schulz,
    triton_rmsnorm,
    triton_rope,
    triton_swiglu,
)
from megatron_zaya.model.documents import lag_visibility_of_ids  # noqa: E402


@dataclass
class Case:
    name: str
    triton: Callable
    eager: Callable
    inputs: list
    bytes: int = 0            # minimum HBM traffic of the Triton kernel(s) per call
    flops: float = 0.0        # for compute-bound kernels
    grads: list | None = None  # upstream grads: time and check forward + backward
    tol: dict = field(default_factory=lambda: dict(atol=1e-5, rtol=1e-5))
    note: str = ""
    inplace: bool = False      # the op writes its first input: check on fresh copies
    reference: Callable | None = None  # the high-precision reference (default: eager, on float64 inputs)


def _rand(*shape, dtype=torch.float32, device="cpu", scale=1.0, shift=0.0, grad=False):
    t = (torch.randn(*shape, device=device) * scale + shift).to(dtype)
    return t.requires_grad_(grad)


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def run_case(case: Case, fn: Callable, fresh: bool = False):
    """Forward (and backward when case.grads): returns the list of outputs and input grads.
    fresh: run on copies of the inputs (for in-place ops, so both backends see the same data)."""
    inputs = [t.detach().clone() if fresh and isinstance(t, torch.Tensor) else t for t in case.inputs]
    outs = _as_tuple(fn(*inputs))
    if case.grads is None:
        return list(outs)
    leaves = [t for t in case.inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    pairs = [(o, g) for o, g in zip(outs, case.grads) if g is not None]
    grads = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs])
    return [o.detach() for o in outs] + list(grads)


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).abs().max()) if a.numel() else 0.0


def check(case: Case) -> bool:
    got, want = run_case(case, case.triton, case.inplace), run_case(case, case.eager, case.inplace)
    if case.inplace:  # the result must differ from the untouched input, or the check proves nothing
        assert not torch.equal(got[0], case.inputs[0]), case.name
    ok = True
    for i, (a, b) in enumerate(zip(got, want)):
        good = a.shape == b.shape and torch.allclose(a.float(), b.float(), **case.tol)
        ok &= good
        print(f"  {case.name:<28} out[{i}] {str(tuple(a.shape)):<18} max|err| {max_err(a, b):.2e}  "
              f"tol atol={case.tol['atol']:.0e} rtol={case.tol['rtol']:.0e}  {'ok' if good else 'FAIL'}")
    return ok


# GPU verdict: each output of the Triton kernel and of eager PyTorch (same inputs, same dtype) is
# compared with the reference run on float64 copies of the inputs (the reference's own upcasts to
# fp32 stay, so for those steps the reference is fp32: still ~2^16 finer than bf16). The kernel
# passes when its relative (Frobenius) error is at most ACCURACY_FACTOR x eager's, or under the
# output dtype's floor (a bf16 output cannot be closer than its rounding; fp32 sums in another order).
ACCURACY_FACTOR = 2.0
ACCURACY_FLOOR = {torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 1e-5, torch.float64: 1e-12}


def _float64(t):
    if isinstance(t, torch.Tensor) and t.is_floating_point():
        return t.detach().double().requires_grad_(t.requires_grad)
    return t


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    x64, ref64 = x.detach().double(), ref.detach().double()
    return float((x64 - ref64).norm() / ref64.norm().clamp_min(1e-30)) if ref64.numel() else 0.0


def accuracy(case: Case) -> list[dict]:
    """Per output (outputs, then input gradients): Triton's and eager's relative error against the
    float64 reference, the limit for Triton's, and whether it is within it."""
    got, eager = run_case(case, case.triton, case.inplace), run_case(case, case.eager, case.inplace)
    ref_case = replace(case, inputs=[_float64(t) for t in case.inputs],
                       grads=None if case.grads is None else [_float64(g) for g in case.grads])
    want = run_case(ref_case, case.reference or case.eager)
    rows = []
    for i, (t, e, r) in enumerate(zip(got, eager, want)):
        err_t, err_e = relative_error(t, r), relative_error(e, r)
        limit = max(ACCURACY_FLOOR.get(t.dtype, 1e-5), ACCURACY_FACTOR * err_e)
        rows.append(dict(output=i, shape=list(t.shape), dtype=str(t.dtype).replace("torch.", ""), triton_error=err_t,
                         eager_error=err_e, limit=limit, ok=t.shape == e.shape and err_t <= limit))
    return rows


def time_ms(fn: Callable, reps: int, warmup: int = 5) -> float:
    """Median milliseconds per call: device events on a GPU, perf_counter otherwise."""
    for _ in range(warmup):
        fn()
    if not GPU:
        import time

        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def device_ms(fn: Callable, reps: int) -> float:
    """Milliseconds of GPU kernel time per call (torch.profiler's CUDA trace: the sum of every kernel,
    copy and fill that one call launches), nan without a GPU. Unlike time_ms, it leaves out the idle
    gaps while the host launches the next kernel, which at these sizes can be most of a call."""
    if not GPU:
        return float("nan")
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    total_us = sum(event.self_device_time_total for event in prof.key_averages())
    return total_us / 1e3 / reps


def copy_bandwidth(reps: int) -> float:
    """Device copy bandwidth in GB/s: 2 x bytes of a 1 GiB copy (64 MiB on CPU) / its median time."""
    nbytes = (1 << 30) if GPU else (1 << 26)
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda" if GPU else "cpu")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), reps)
    del src, dst
    return 2 * nbytes / (ms * 1e-3) / 1e9


def _peak_gib(reset: bool = False) -> float:
    if not GPU:
        return float("nan")
    if reset:
        torch.cuda.reset_peak_memory_stats()
    return torch.cuda.max_memory_allocated() / 2**30


# ----------------------------------------------------------------------------------------- cases


def make_cases(dev: str, small: bool) -> list[Case]:
    bf16, f32 = torch.bfloat16, torch.float32
    # GPU: ZAYA1 shapes (D 2048, 2 x 4096 tokens, 8 q heads of 128, vocab 262,272, 16 experts).
    # CPU (interpreter): small ragged shapes, fp32 so the tolerances are tight.
    n, d = (13, 37) if small else (8192, 2048)
    act = f32 if small else bf16
    tol_act = dict(atol=1e-5, rtol=1e-5) if small else dict(atol=2e-2, rtol=2e-2)
    cases = []

    # RMSNorm alone (bf16 in, fp32 weight -> fp32 out in the reference contract; use bf16 weight)
    x = _rand(n, d, dtype=act, device=dev, grad=True)
    w = _rand(d, dtype=act, device=dev, shift=1.0, grad=True)
    e = x.element_size()
    cases.append(Case("rms_norm fwd+bwd", lambda a, b: triton_rmsnorm.rms_norm(a, b, 1e-5),
                      lambda a, b: R.rms_norm(a, b, 1e-5), [x, w], bytes=n * d * e * 5,
                      grads=[_rand(n, d, dtype=act, device=dev)], tol=tol_act))

    # Residual merge + RMSNorm: out bf16, residual fp32, normed bf16.
    out = _rand(n, d, dtype=act, device=dev, grad=True)
    res = _rand(n, d, dtype=f32, device=dev, scale=2.0, grad=True)
    ps = [_rand(d, device=dev, scale=0.1, shift=s, grad=True) for s in (1.0, 0.0, 1.0, 0.0)]
    nw = _rand(d, device=dev, shift=1.0, grad=True)
    args = [out, res, *ps, nw]
    fused = lambda *a: triton_rmsnorm.scaled_residual_add_rms_norm(*a, 1e-5, act)  # noqa: E731
    eager = lambda *a: R.scaled_residual_add_rms_norm(*a, 1e-5, act)  # noqa: E731
    fwd_bytes = n * d * (e + 4 + 4 + e)  # read out, residual; write new residual, normed
    reference = lambda *a: R.scaled_residual_add_rms_norm(*a, 1e-5, torch.float64)  # noqa: E731
    cases.append(Case("residual+rms_norm fwd", fused, eager, args, bytes=fwd_bytes, tol=tol_act, reference=reference))
    bwd_bytes = n * d * (e + 4 + e + 4 + e + 4)  # read out, residual, d_normed, d_residual; write d_out, d_res
    cases.append(Case("residual+rms_norm fwd+bwd", fused, eager, args, bytes=fwd_bytes + bwd_bytes,
                      grads=[_rand(n, d, device=dev), _rand(n, d, dtype=act, device=dev)], tol=tol_act,
                      reference=reference))

    # SwiGLU on the expert hidden (2 x 2048).
    h = 19 if small else 2048
    gu = _rand(n, 2 * h, dtype=act, device=dev, grad=True)
    cases.append(Case("swiglu fwd", triton_swiglu.swiglu, R.swiglu, [gu], bytes=n * 3 * h * e, tol=tol_act))
    cases.append(Case("swiglu fwd+bwd", triton_swiglu.swiglu, R.swiglu, [gu], bytes=n * h * e * (3 + 5),
                      grads=[_rand(n, h, dtype=act, device=dev)], tol=tol_act))

    # Partial RoPE on q (B, S, 8, 128), rotary dim 64; in place (rotary half only) and out of place.
    b, s, hq, dh, rd = (2, 3, 5, 12, 8) if small else (2, 4096, 8, 128, 64)
    ang = torch.randn(1, s, rd, device=dev)
    cos, sin = torch.cos(ang), torch.sin(ang)
    q = _rand(b, s, hq, dh, dtype=act, device=dev, grad=True)
    cases.append(Case("rope fwd+bwd", triton_rope.apply_partial_rope, R.apply_partial_rope, [q, cos, sin],
                      bytes=2 * 2 * b * s * hq * dh * e, grads=[_rand(b, s, hq, dh, dtype=act, device=dev)], tol=tol_act))
    q_buf = _rand(b, s, hq, dh, dtype=act, device=dev)
    cases.append(Case("rope in-place fwd", lambda x, c, sn: triton_rope.apply_partial_rope_(x, c, sn),
                      lambda x, c, sn: R.apply_partial_rope_(x, c, sn), [q_buf, cos, sin],
                      bytes=2 * b * s * hq * rd * e, tol=tol_act, inplace=True,
                      note="in place: repeated calls keep rotating the same buffer (timing only is meaningful)"))

    # Cross-entropy over the full vocab (one rank), bf16 logits.
    nt, v = (7, 300) if small else (4096, 262272)
    logits = _rand(nt, v, dtype=act, device=dev, scale=3.0, grad=True)
    labels = torch.randint(0, v, (nt,), device=dev)
    labels[1] = R.IGNORE_INDEX
    ce_tri = lambda z, y: ce_autograd.VocabParallelCrossEntropy.apply(z, y, 0, None, R.IGNORE_INDEX, triton_cross_entropy)  # noqa: E731
    ce_tol = dict(atol=1e-5, rtol=1e-5) if small else dict(atol=1e-3, rtol=1e-3)
    le = logits.element_size()
    cases.append(Case("cross_entropy fwd", ce_tri, R.cross_entropy, [logits, labels], bytes=nt * v * le, tol=ce_tol))
    cases.append(Case("cross_entropy fwd+bwd", ce_tri, R.cross_entropy, [logits, labels], bytes=nt * v * le * 3,
                      grads=[_rand(nt, device=dev)], tol=dict(atol=1e-5, rtol=1e-5) if small else dict(atol=2e-2, rtol=2e-2)))

    # LM head + cross-entropy, chunked (never the full fp32 logits).
    nt2, dd, v2 = (9, 16, 70) if small else (8192, 2048, 262272)
    hid = _rand(nt2, dd, dtype=act, device=dev, grad=True)
    wte = _rand(v2, dd, dtype=act, device=dev, scale=0.02, grad=True)
    lab2 = torch.randint(0, v2, (nt2,), device=dev)
    lce = lambda hh, ww, yy: ce_autograd.LinearCrossEntropy.apply(  # noqa: E731
        hh, ww, yy, 0, None, "mean", R.IGNORE_INDEX, 4 if small else 2048, triton_cross_entropy)
    cases.append(Case("linear_cross_entropy fwd+bwd", lce, R.linear_cross_entropy, [hid, wte, lab2],
                      flops=6.0 * nt2 * dd * v2, grads=[torch.ones((), device=dev)],
                      tol=dict(atol=1e-5, rtol=1e-5) if small else dict(atol=2e-2, rtol=2e-2),
                      note="matmul-bound; the gain is memory (see peak memory)"))

    # MoE permute -> scale -> unpermute, 16 experts + skip.
    ne = 3 if small else 16
    xt = _rand(n, d, dtype=act, device=dev, grad=True)
    idx = torch.randint(0, ne + 1, (n,), device=dev)
    gate = torch.rand(n, device=dev, requires_grad=True)

    def moe(mod):
        def f(xx, gg):
            perm, order, _ = mod.moe_permute(xx, idx, ne)
            return mod.moe_unpermute(perm * 1.5, order, gg, n)
        return f

    cases.append(Case("moe permute+unpermute fwd+bwd", moe(triton_moe_permute), moe(R), [xt, gate],
                      bytes=n * d * e * 8, grads=[_rand(n, d, dtype=act, device=dev)], tol=tol_act,
                      note="includes the eager scale between the two and the argsort"))

    # CCA causal conv pair on packed q0/k0: (2, 4096, 1280), 10 groups of 128, kernels 2 and 2.
    bb, ss, grp, hd = (2, 13, 3, 16) if small else (2, 4096, 10, 128)
    cc = grp * hd
    packed = _rand(bb, ss, cc, dtype=act, device=dev, grad=True)
    conv_params = [_rand(cc, 1, 2, dtype=act, device=dev, scale=0.5, grad=True), _rand(cc, dtype=act, device=dev, scale=0.1, grad=True),
                   _rand(cc, hd, 2, dtype=act, device=dev, scale=hd ** -0.5, grad=True), _rand(cc, dtype=act, device=dev, scale=0.1, grad=True)]
    conv_tol = dict(atol=1e-5, rtol=1e-5) if small else dict(atol=5e-2, rtol=5e-2)
    cases.append(Case("cca conv fwd", triton_cca_conv.cca_causal_conv, R.cca_causal_conv, [packed, *conv_params],
                      bytes=2 * bb * ss * cc * e, tol=conv_tol, note="eager: transpose + pad + 2 cuDNN convs"))
    cases.append(Case("cca conv fwd+bwd", triton_cca_conv.cca_causal_conv, R.cca_causal_conv, [packed, *conv_params],
                      bytes=bb * ss * cc * (2 * e + 3 * e + 4), grads=[_rand(bb, ss, cc, dtype=act, device=dev)],
                      tol=dict(atol=2e-5, rtol=2e-5) if small else dict(atol=1e-1, rtol=5e-2),
                      note="weight grads are torch reductions; bytes count the kernels only"))
    # The same with packed documents (--reset-attention-mask): documents of 512 tokens (3 in the small case).
    document_ids = torch.arange(ss, device=dev).div(3 if small else 512, rounding_mode="floor").expand(bb, ss)
    visible = lag_visibility_of_ids(document_ids, 2)
    cases.append(Case("cca conv segmented fwd+bwd", triton_cca_conv.cca_causal_conv_segmented, R.cca_causal_conv_segmented,
                      [packed, *conv_params, visible], bytes=bb * ss * (cc * (2 * e + 3 * e + 4) + 2),
                      grads=[_rand(bb, ss, cc, dtype=act, device=dev)],
                      tol=dict(atol=2e-5, rtol=2e-5) if small else dict(atol=1e-1, rtol=5e-2),
                      note="eager: shifted sums per tap (kernels/reference.py); bytes count the kernels only"))

    # Newton-Schulz on a batch of expert matrices (bf16 on GPU as in Muon, fp32 in the interpreter).
    nb, m, k = (3, 20, 37) if small else (16, 2048, 2048)
    ns_dtype = f32 if small else bf16
    gmat = _rand(nb, m, k, device=dev)
    cases.append(Case("newton_schulz x5 (batched)", lambda g: triton_newton_schulz.newton_schulz(g, 5, dtype=ns_dtype),
                      lambda g: R.newton_schulz(g, 5, dtype=ns_dtype), [gmat],
                      flops=5 * nb * (2 * m * m * k + 2 * m ** 3 + 2 * m * m * k),
                      tol=dict(atol=1e-4, rtol=1e-4) if small else dict(atol=5e-2, rtol=5e-2),
                      reference=lambda g: R.newton_schulz(g, 5, dtype=torch.float64),
                      note="flops counted as the reference's 3 full matmuls per step"))
    return cases


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="", help="comma-separated substrings of case names")
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--list", action="store_true")
    p.add_argument("--json", default="", help="write the GPU results to this file")
    p.add_argument("--time-on-cpu", action="store_true",
                   help="without a GPU, run the timing/report path on the interpreter (tests the script; "
                        "the numbers mean nothing)")
    a = p.parse_args()
    torch.manual_seed(0)
    dev = "cuda" if GPU else "cpu"
    cases = make_cases(dev, small=not GPU)
    if a.list:
        print("\n".join(c.name for c in cases))
        return 0
    if a.only:
        keys = [k.strip() for k in a.only.split(",") if k.strip()]
        cases = [c for c in cases if any(k in c.name for k in keys)]

    if not GPU and not a.time_on_cpu:
        print("no GPU: Triton interpreter check (TRITON_INTERPRET=1), small ragged fp32 shapes")
        ok = True
        for c in cases:
            ok &= check(c)
        print("interpreter check:", "PASS" if ok else "FAIL")
        return 0 if ok else 1

    name = torch.cuda.get_device_name() if GPU else "cpu (Triton interpreter: timings are meaningless)"
    bw = copy_bandwidth(a.reps)
    print(f"device: {name}; torch {torch.__version__}; measured copy bandwidth {bw:.0f} GB/s")
    print(f"{'kernel':<32}{'triton ms':>10}{'eager ms':>10}{'speedup':>9}{'GB/s':>8}{'%copy':>7}{'TFLOP/s':>9}  check")
    results = []
    ok = True
    for c in cases:
        errors = accuracy(c)
        good = all(row["ok"] for row in errors)
        ok &= good
        _peak_gib(reset=True)
        t_tri = time_ms(lambda: run_case(c, c.triton), a.reps, warmup=5 if GPU else 0)
        mem_tri = _peak_gib()
        _peak_gib(reset=True)
        t_eag = time_ms(lambda: run_case(c, c.eager), a.reps, warmup=5 if GPU else 0)
        mem_eag = _peak_gib()
        try:
            dev_tri = device_ms(lambda: run_case(c, c.triton), max(a.reps // 5, 3))
            dev_eag = device_ms(lambda: run_case(c, c.eager), max(a.reps // 5, 3))
        except Exception as exc:  # the profiler is a diagnostic: its failure must not lose the table
            print(f"    device time not measured: {exc!r}")
            dev_tri = dev_eag = float("nan")
        dev_gbs = c.bytes / (dev_tri * 1e-3) / 1e9 if c.bytes else float("nan")
        gbs = c.bytes / (t_tri * 1e-3) / 1e9 if c.bytes else float("nan")
        tfs = c.flops / (t_tri * 1e-3) / 1e12 if c.flops else float("nan")
        print(f"{c.name:<32}{t_tri:>10.3f}{t_eag:>10.3f}{t_eag / t_tri:>8.2f}x{gbs:>8.0f}{100 * gbs / bw:>6.0f}%"
              f"{tfs:>9.1f}  {'ok' if good else 'MISMATCH'}  peak GiB {mem_tri:.1f} vs {mem_eag:.1f}"
              + (f"  ({c.note})" if c.note else ""))
        print(f"    GPU kernel time per call: triton {dev_tri:.3f} ms ({dev_gbs:.0f} GB/s, {100 * dev_gbs / bw:.0f}% of copy), "
              f"eager {dev_eag:.3f} ms: {dev_eag / dev_tri:.2f}x (the rest of the times above is the host launching kernels)")
        for row in errors:
            print(f"    out[{row['output']}] {row['dtype']:<8} {str(tuple(row['shape'])):<18} error vs float64: triton "
                  f"{row['triton_error']:.2e}, eager {row['eager_error']:.2e} (limit {row['limit']:.2e})"
                  f"{'' if row['ok'] else '  MISMATCH'}")
        results.append(dict(kernel=c.name, triton_ms=t_tri, eager_ms=t_eag, speedup=t_eag / t_tri, gbps=gbs,
                            copy_gbps=bw, tflops=tfs, device_ms=dev_tri, device_ms_eager=dev_eag, device_gbps=dev_gbs, check=good, errors=errors, peak_gib_triton=mem_tri,
                            peak_gib_eager=mem_eag))
        if a.json:        # after every kernel: a time limit that stops the run keeps the ones measured
            with open(a.json, "w") as f:
                json.dump(dict(device=name, torch=torch.__version__, results=results), f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
