"""kernels/capability.py: which devices run bf16 matmuls natively, Muon's Newton-Schulz dtype that
follows from it, the --bf16 warning on CPUs without native bf16, and a matmul-peak measurement that
stays short where bf16 matmuls crawl."""
import io
from contextlib import redirect_stderr
from types import SimpleNamespace

import torch

from megatron_zaya.kernels import capability
from megatron_zaya.optim import muon as muon_module
from megatron_zaya.optim.muon import Muon
from megatron_zaya.training import metrics, setup


def test_gpus_are_native_and_cpus_follow_onednn():
    assert capability.bf16_matmul_is_native(torch.device("cuda", 0))
    assert capability.bf16_matmul_is_native("cpu") == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert capability.newton_schulz_dtype("cuda") == torch.bfloat16


def test_newton_schulz_dtype_and_warning_follow_the_capability(monkeypatch):
    monkeypatch.setattr(capability, "bf16_matmul_is_native", lambda device: True)
    assert capability.newton_schulz_dtype("cpu") == torch.bfloat16
    assert capability.slow_bf16_warning("cpu") is None
    monkeypatch.setattr(capability, "bf16_matmul_is_native", lambda device: False)
    assert capability.newton_schulz_dtype("cpu") == torch.float32
    warning = capability.slow_bf16_warning("cpu")
    assert warning.startswith("--bf16:") and "drop --bf16" in warning
    assert capability.slow_bf16_warning("cpu", "--dtype bf16").startswith("--dtype bf16: this CPU")


def _muon_update(ns_dtype, seed=3):
    torch.manual_seed(seed)
    p = torch.nn.Parameter(torch.zeros(2, 24, 40))
    p.grad = torch.randn(2, 24, 40)
    Muon([p], lr=1.0, momentum=0.9, ns_dtype=ns_dtype).step()
    return p.detach().clone()


def test_muon_default_newton_schulz_dtype_is_the_devices(monkeypatch):
    """ns_dtype=None runs Newton-Schulz in the device's dtype: bit-equal to that dtype given
    explicitly, and different from the other one (so the choice is really made)."""
    fp32, bf16 = _muon_update(torch.float32), _muon_update(torch.bfloat16)
    assert not torch.equal(fp32, bf16)
    for native, expected in ((True, bf16), (False, fp32)):
        monkeypatch.setattr(muon_module, "newton_schulz_dtype",
                            lambda device, native=native: torch.bfloat16 if native else torch.float32)
        assert torch.equal(_muon_update(None), expected)


def test_build_runtime_warns_about_bf16_only_where_it_is_slow(monkeypatch):
    def build(bf16):
        run = SimpleNamespace(parallel=SimpleNamespace(world_size=1, use_distributed_optimizer=False),
                              train=SimpleNamespace(bf16=bf16))
        err = io.StringIO()
        with redirect_stderr(err):
            setup.build_runtime(run)
        return err.getvalue()

    monkeypatch.setattr(setup, "slow_bf16_warning", lambda device: "--bf16: slow here")
    assert build(bf16=True) == "WARNING --bf16: slow here\n"
    assert build(bf16=False) == ""
    monkeypatch.setattr(setup, "slow_bf16_warning", lambda device: None)
    assert build(bf16=True) == ""


def test_matmul_peak_shrinks_the_size_to_the_time_budget(monkeypatch):
    sizes = []
    randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *shape, **kw: sizes.append(shape[0]) or randn(*shape, **kw))
    assert metrics.measure_matmul_tflops(torch.float32, size=4096, repeats=2, time_budget_s=0.0) > 0
    assert set(sizes) == {128}                     # no budget: the smallest size only
    sizes.clear()
    assert metrics.measure_matmul_tflops(torch.float32, size=256, repeats=2, time_budget_s=60.0) > 0
    assert set(sizes) == {128, 256}                # within budget: up to the size asked for



def test_cpu_mfu_peak_is_fp32s_where_bf16_is_not_native(monkeypatch):
    peaks = {torch.bfloat16: 0.001, torch.float32: 0.05}
    monkeypatch.setattr(metrics, "measure_matmul_tflops", lambda dtype, *a, **k: peaks[dtype])
    cpu = torch.device("cpu")
    monkeypatch.setattr(metrics, "_cpu_peak_cache", {})
    monkeypatch.setattr(metrics, "bf16_matmul_is_native", lambda device: False)
    assert metrics.device_peak_tflops(cpu, torch.bfloat16) == (0.05, "measured CPU float32 matmul, bf16 not native")
    assert metrics.device_peak_tflops(cpu, torch.float32) == (0.05, "measured CPU float32 matmul")
    monkeypatch.setattr(metrics, "_cpu_peak_cache", {})
    monkeypatch.setattr(metrics, "bf16_matmul_is_native", lambda device: True)
    assert metrics.device_peak_tflops(cpu, torch.bfloat16) == (0.001, "measured CPU bfloat16 matmul")


def test_newton_schulz_in_float64_takes_the_reference_for_fp32_matrices_too():
    """The Triton kernels compute in fp32: a float64 Newton-Schulz of fp32 gradients goes to the reference, as a
    float64 input does (it went to Triton, which asks for the interpreter on CPU tensors, and on a GPU would have
    computed in fp32 and returned float64)."""
    import megatron_zaya.kernels as K
    from megatron_zaya.kernels import reference as R
    grads, backend = [torch.randn(2, 6, 4), torch.randn(5, 3)], K.kernel_backend()
    K.set_kernel_backend("triton")
    try:
        got = K.newton_schulz(grads[0], dtype=torch.float64)
        many = K.newton_schulz_many(grads, dtype=torch.float64)
    finally:
        K.set_kernel_backend(backend)
    assert torch.equal(got, R.newton_schulz(grads[0], dtype=torch.float64)) and got.dtype == torch.float64
    for g, m in zip(grads, many):
        assert torch.equal(m, R.newton_schulz(g, dtype=torch.float64))
