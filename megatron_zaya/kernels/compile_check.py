"""Compile every Triton kernel for GPU targets on any machine, without a GPU.

    python -m megatron_zaya.kernels.compile_check                  # sm_90 (H100/H200) and gfx942 (MI300X)
    python -m megatron_zaya.kernels.compile_check --targets cuda:80,hip:gfx90a --all-configs

The interpreter tests check the kernels' math on CPU; this checks that the same sources lower
through Triton's real compiler (TTIR -> TTGIR -> LLVM -> PTX/cubin or AMDGCN/hsaco) with the
argument types, constexprs and autotune configs that the wrappers actually launch with. It runs
each wrapper forward and backward on CPU tensors at ZAYA1-like sizes with the kernel launches
replaced by a recorder (nothing executes, the outputs are left uninitialised), then compiles
each recorded specialisation with `triton.compile` for each target. For each compiled kernel it
prints the registers and spill bytes per thread (from ptxas for CUDA, from the AMDGPU metadata for
HIP) and lists the kernels that spill at the end; a spill is slow, not wrong, so it does not fail the
check. Must run in a process where TRITON_INTERPRET is unset, since @triton.jit decides at definition time.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

_TORCH_TO_TRITON = {
    torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1",
}


def _record_launches():
    """Patch JITFunction.run / Autotuner.run to record launches instead of running them."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    records = []

    def jit_run(self, *args, grid=None, warmup=False, **kwargs):
        records.append((self, args, kwargs, [None]))

    def tuned_run(self, *args, **kwargs):
        kwargs.pop("grid", None)
        kwargs.pop("warmup", None)
        records.append((self.fn, args, kwargs, list(self.configs)))

    JITFunction.run = jit_run
    Autotuner.run = tuned_run
    return records


def _drive_wrappers():
    """Call every Triton wrapper, forward and backward, the way the model and optimizer do."""
    from megatron_zaya.kernels import ce_autograd, reference
    from megatron_zaya.kernels import triton_cca_conv, triton_cross_entropy, triton_moe_permute
    from megatron_zaya.kernels import triton_newton_schulz, triton_rmsnorm, triton_rope, triton_swiglu

    bf16, f32 = torch.bfloat16, torch.float32

    def leaf(*shape, dtype=bf16):
        return torch.randn(*shape).to(dtype).requires_grad_(True)

    def backward(out):
        outs = out if isinstance(out, tuple) else (out,)
        torch.autograd.backward([o for o in outs], [torch.ones_like(o) for o in outs])

    d = 2048
    backward(triton_rmsnorm.rms_norm(leaf(4, d), leaf(d, dtype=f32), 1e-5))
    params = [leaf(d, dtype=f32) for _ in range(5)]
    backward(triton_rmsnorm.scaled_residual_add_rms_norm(leaf(4, d), leaf(4, d, dtype=f32), *params[:4], params[4], 1e-5, bf16))
    backward(triton_rmsnorm.scaled_residual_add(leaf(4, d), leaf(4, d, dtype=f32), *params[:4]))
    backward(triton_swiglu.swiglu(leaf(4, 2 * 2048)))
    cos, sin = torch.randn(1, 3, 64), torch.randn(1, 3, 64)
    backward(triton_rope.apply_partial_rope(leaf(2, 3, 8, 128), cos, sin))
    backward(triton_rope.apply_partial_rope_(leaf(2, 3, 2, 128) * 1, cos, sin))
    labels = torch.randint(0, 262272, (2,))
    backward(ce_autograd.VocabParallelCrossEntropy.apply(leaf(2, 262272), labels, 0, None, -100, triton_cross_entropy))
    backward(ce_autograd.LinearCrossEntropy.apply(leaf(4, 64), leaf(300, 64), torch.randint(0, 300, (4,)), 0, None, "mean",
                                                   -100, 2, triton_cross_entropy))
    x = leaf(16, d)
    perm, order, _ = triton_moe_permute.moe_permute(x, torch.randint(0, 17, (16,)), 16)
    backward(triton_moe_permute.moe_unpermute(perm, order, torch.rand(16, requires_grad=True), 16))
    triton_newton_schulz.newton_schulz(torch.randn(2, 256, 512), steps=1)
    triton_newton_schulz.newton_schulz(torch.randn(2, 256, 512), steps=1, dtype=f32)   # Muon(ns_dtype=fp32)
    conv = [leaf(1280, 1, 2), leaf(1280), leaf(1280, 128, 2), leaf(1280)]
    backward(triton_cca_conv.cca_causal_conv(leaf(1, 8, 1280), *conv))
    backward(triton_cca_conv.cca_causal_conv(leaf(1, 8, 1280), *conv, leaf(1, 1280, 2)))
    backward(triton_cca_conv.cca_causal_conv_segmented(leaf(1, 8, 1280), *conv, torch.ones(1, 8, 2, dtype=torch.bool)))
    del reference


def _signature(fn, args, kwargs, config):
    values = dict(zip(fn.arg_names, args))
    values.update(kwargs)
    options = {}
    if config is not None:
        values.update(config.kwargs)
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    else:
        for key in ("num_warps", "num_stages"):
            if key in values:
                options[key] = values.pop(key)
    sig, constexprs = {}, {}
    for p in fn.params:
        v = values[p.name]
        if p.is_constexpr or v is None:
            sig[p.name] = "constexpr"
            constexprs[p.name] = v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = "*" + _TORCH_TO_TRITON[v.dtype]
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            sig[p.name] = "i64" if abs(v) >= 2**31 else "i32"
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: cannot type argument {p.name}={v!r}")
    return sig, constexprs, options


def ptxas_usage(ptx: str, arch: int) -> str:
    """Registers and spill bytes per thread from `ptxas -v` (the ptxas Triton itself uses)."""
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        suffix = "a" if arch >= 90 else ""
        proc = subprocess.run([get_ptxas(arch).path, f"-arch=sm_{arch}{suffix}", "-v", src, "-o", os.path.join(tmp, "k.o")],
                              capture_output=True, text=True)
    regs = re.search(r"Used (\d+) registers", proc.stderr)
    spill = re.search(r"(\d+) bytes spill stores", proc.stderr)
    return f"regs {regs.group(1) if regs else '?'} spill {spill.group(1) if spill else '?'}B"


def amdgcn_usage(amdgcn: str) -> str:
    """Registers and spill bytes per thread from the AMDGPU metadata at the end of the kernel's assembly:
    `.vgpr_count` (vector registers, accumulation registers included) and `.private_segment_fixed_size` (the
    scratch memory each thread gets, which holds the VGPR spills and any SGPR spills that found no free VGPR lane;
    SGPR spills into VGPR lanes cost no memory access and are not counted)."""
    import re

    regs = re.search(r"^\s*\.vgpr_count:\s+(\d+)", amdgcn, re.MULTILINE)
    spill = re.search(r"^\s*\.private_segment_fixed_size:\s+(\d+)", amdgcn, re.MULTILINE)
    return f"regs {regs.group(1) if regs else '?'} spill {spill.group(1) if spill else '?'}B"


def register_usage(kernel, target) -> str:
    """`regs N spill MB` (per thread) of a compiled kernel: from ptxas for CUDA, from the AMDGPU metadata for HIP."""
    if target.backend == "cuda":
        return ptxas_usage(kernel.asm["ptx"], target.arch)
    return amdgcn_usage(kernel.asm["amdgcn"])


# Shared memory one program may use (bytes): MI300X's 64 KiB LDS per workgroup; H100/H200's 227 KiB and A100's
# 163 KiB of opt-in shared memory per block. A config above it compiles but cannot launch.
SHARED_MEMORY_LIMITS = {("hip", "gfx942"): 65536, ("hip", "gfx90a"): 65536, ("cuda", 90): 232448,
                        ("cuda", 80): 166912}


def shared_memory_fits(kernel, target) -> bool | None:
    """Whether the compiled kernel's shared memory fits the target (None: no limit known for it)."""
    limit = SHARED_MEMORY_LIMITS.get((target.backend, target.arch))
    return None if limit is None else kernel.metadata.shared <= limit


def parse_targets(spec: str):
    from triton.backends.compiler import GPUTarget

    out = []
    for item in spec.split(","):
        backend, arch = item.strip().split(":")
        if backend == "cuda":
            out.append(GPUTarget("cuda", int(arch), 32))
        elif backend == "hip":
            out.append(GPUTarget("hip", arch, 64))
        else:
            raise ValueError(f"unknown backend {backend!r} (cuda:SM or hip:gfxNNN)")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", default="cuda:90,hip:gfx942")
    p.add_argument("--all-configs", action="store_true", help="compile every autotune config (default: the first)")
    p.add_argument("--only", default="", help="comma-separated substrings of module.kernel names")
    a = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("compile_check: unset TRITON_INTERPRET (the kernels would be interpreter functions)")
        return 2
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    import triton
    from triton.compiler import ASTSource

    targets = parse_targets(a.targets)
    records = _record_launches()
    _drive_wrappers()
    seen, failures, count, spills = set(), 0, 0, []
    launchable: dict[tuple, bool] = {}     # (launch, target) -> whether any config compiled fits its memory
    for fn, args, kwargs, configs in records:
        for config in configs if a.all_configs else configs[:1]:
            sig, constexprs, options = _signature(fn, args, kwargs, config)
            key = (fn.__module__, fn.__name__, tuple(sorted(sig.items())), tuple(sorted((k, str(v)) for k, v in constexprs.items())),
                   tuple(sorted(options.items())))
            if key in seen:
                continue
            seen.add(key)
            label = f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"
            if a.only and not any(k.strip() in label for k in a.only.split(",") if k.strip()):
                continue
            consts = " ".join(f"{k}={v}" for k, v in constexprs.items() if v is not None)
            consts += f" warps={options.get('num_warps', 4)}"
            for target in targets:
                start = time.time()
                launch = (id(args), label, str(target))
                try:
                    kernel = triton.compile(ASTSource(fn, sig, constexprs), target=target, options=options)
                    status = "ok " + "/".join(k for k in kernel.asm if k in ("cubin", "hsaco"))
                    fits = shared_memory_fits(kernel, target)
                    status += f" smem {kernel.metadata.shared}B"
                    status += " EXCEEDS the target's limit" if fits is False else ""
                    launchable[launch] = launchable.get(launch, False) or fits is not False
                    usage = register_usage(kernel, target)
                    status += " " + usage
                    if not usage.endswith(" 0B"):
                        spills.append(f"{label} {target.arch} {usage}")
                    if target.backend == "cuda" and ".tf32" in kernel.asm["ptx"]:  # the references: fp32 in fp32
                        failures += 1
                        status = "FAIL fp32 operands rounded to TF32 (tl.dot without input_precision='ieee')"
                except Exception as exc:  # report every failure, then fail the run
                    failures += 1
                    status = "FAIL " + repr(exc).splitlines()[-1][:300]
                count += 1
                print(f"{label:<42} {target.backend}:{target.arch!s:<7} {time.time() - start:5.1f}s  {status}  [{consts}]")
    stuck = sorted({f"{label} {target}" for (_, label, target), fits in launchable.items() if not fits})
    if stuck:     # every config compiled for this launch needs more shared memory than the target has
        print("no config that fits the target's shared memory (it cannot launch there; with --all-configs every "
              "config was tried):\n  " + "\n  ".join(stuck))
        failures += len(stuck) if a.all_configs else 0
    print(f"compile check: {count - failures}/{count} compiled" + (" - FAIL" if failures else " - PASS"))
    if spills:
        print("register spills (slow, not wrong):\n  " + "\n  ".join(spills))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
