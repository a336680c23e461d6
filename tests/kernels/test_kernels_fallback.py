"""megatron_zaya.kernels without a usable triton: import works, "auto" runs the reference, and a
forced "triton" backend raises. Runs in a subprocess with `triton` made unimportable."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import os, sys, warnings
    sys.modules["triton"] = None  # any `import triton` now raises ImportError
    import torch
    import megatron_zaya.kernels as K
    from megatron_zaya.kernels import reference as R
    assert K.kernel_backend() == "auto"
    x = torch.randn(3, 8)
    assert torch.equal(K.swiglu(x), R.swiglu(x))
    assert torch.equal(K.rms_norm(x, torch.ones(8), 1e-5), R.rms_norm(x, torch.ones(8), 1e-5))
    assert not any(m.startswith("megatron_zaya.kernels.triton_") for m in sys.modules)
    with warnings.catch_warnings(record=True) as seen:    # auto: one warning for all the kernel modules
        warnings.simplefilter("always")
        assert not K.triton_available("rmsnorm") and not K.triton_available("swiglu")
    assert len(seen) == 1 and "using PyTorch" in str(seen[0].message), [str(w.message) for w in seen]
    K.set_kernel_backend("triton")
    os.environ["TRITON_INTERPRET"] = "1"                  # CPU tensors may go to Triton: its import is tried
    with warnings.catch_warnings(record=True) as seen:    # triton: an error, not a warning saying "using PyTorch"
        warnings.simplefilter("always")
        try:
            K.cross_entropy(x, torch.zeros(3, dtype=torch.long))
        except RuntimeError as exc:
            print("forced triton:", exc)
        else:
            raise AssertionError("forced triton without triton must raise")
    assert not seen, [str(w.message) for w in seen]
    assert K.triton_available() is False
    K.set_kernel_backend("torch")
    assert torch.equal(K.swiglu(x), R.swiglu(x))
    print("OK")
    """
)


def test_import_and_fallback_without_triton():
    env = dict(os.environ, MEGATRON_ZAYA_KERNELS="auto")
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("OK")


def test_env_var_selects_backend():
    env = dict(os.environ, MEGATRON_ZAYA_KERNELS="torch")
    code = "import megatron_zaya.kernels as K; print(K.kernel_backend())"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "torch", proc.stderr
    # A value it cannot be: the import warns (a tool runs on auto), and a training run stops with one line
    # before any work (it was a traceback at import, before even --help).
    env["MEGATRON_ZAYA_KERNELS"] = "bogus"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "auto", proc.stderr
    assert "MEGATRON_ZAYA_KERNELS='bogus': expected one of auto, triton, torch; using auto" in proc.stderr
    proc = subprocess.run([sys.executable, "pretrain_zaya.py", "--mock-data", "--tokenizer-type", "NullTokenizer",
                           "--vocab-size", "512", "--train-iters", "1"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "pretrain_zaya.py: error: MEGATRON_ZAYA_KERNELS='bogus': expected one of" in proc.stderr
