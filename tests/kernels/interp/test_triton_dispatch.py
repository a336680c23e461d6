"""The backend switch of megatron_zaya.kernels: forced Triton on CPU (interpreted) runs the
kernels; "torch" and "auto" on CPU run the reference; every exported name keeps its signature."""
import inspect

import pytest
import torch

import megatron_zaya.kernels as K
from megatron_zaya.kernels import reference as R


def test_exported_signatures_match_reference():
    for name in ["rms_norm", "scaled_residual_add", "scaled_residual_add_rms_norm", "swiglu",
                 "apply_partial_rope", "cross_entropy", "moe_permute", "moe_unpermute", "newton_schulz"]:
        # the dispatcher may add one trailing memory-policy keyword, `recompute` (selective recomputation)
        exported = [p for p in inspect.signature(getattr(K, name)).parameters if p != "recompute"]
        assert exported == list(inspect.signature(getattr(R, name)).parameters), name


def test_set_kernel_backend_validates():
    with pytest.raises(ValueError):
        K.set_kernel_backend("cuda")


def _calls(monkeypatch, module_name, fn_name):
    """Count calls to a Triton module function (wrapping, not replacing it)."""
    import importlib

    mod = importlib.import_module(f"megatron_zaya.kernels.triton_{module_name}")
    original = getattr(mod, fn_name)
    counter = []

    def wrapped(*a, **k):
        counter.append(1)
        return original(*a, **k)

    monkeypatch.setattr(mod, fn_name, wrapped)
    return counter


@pytest.mark.parametrize("backend,expect_triton", [("triton", True), ("torch", False), ("auto", False)])
def test_switch_routes_cpu_calls(backend, expect_triton, monkeypatch):
    calls = _calls(monkeypatch, "swiglu", "swiglu")
    previous = K.kernel_backend()
    K.set_kernel_backend(backend)
    try:
        x = torch.randn(3, 10)
        torch.testing.assert_close(K.swiglu(x), R.swiglu(x), atol=1e-5, rtol=1e-5)
    finally:
        K.set_kernel_backend(previous)
    assert bool(calls) == expect_triton


def test_forced_triton_every_op_runs(triton_backend):
    """Each dispatched op goes through its Triton module and agrees with the reference."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=gen)
    w = torch.randn(6, generator=gen)
    torch.testing.assert_close(K.rms_norm(x, w, 1e-5), R.rms_norm(x, w, 1e-5), atol=1e-5, rtol=1e-5)
    ones, zeros = torch.ones(6), torch.zeros(6)
    got = K.scaled_residual_add_rms_norm(x, x * 2, ones, zeros, ones, zeros, w, 1e-5)
    want = R.scaled_residual_add_rms_norm(x, x * 2, ones, zeros, ones, zeros, w, 1e-5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    q = torch.randn(1, 2, 2, 8, generator=gen)
    cos, sin = torch.randn(1, 2, 4, generator=gen), torch.randn(1, 2, 4, generator=gen)
    torch.testing.assert_close(K.apply_partial_rope(q, cos, sin), R.apply_partial_rope(q, cos, sin), atol=1e-5, rtol=1e-5)
    idx = torch.tensor([1, 0, 2, 1])
    perm, order, counts = K.moe_permute(x, idx, 2)
    assert torch.equal(perm, x[[1, 0, 3]]) and counts.tolist() == [1, 2]
    packed = torch.randn(1, 5, 32, generator=gen)
    conv = [torch.randn(32, 1, 2, generator=gen), torch.randn(32, generator=gen), torch.randn(32, 16, 2, generator=gen) * 0.2,
            torch.randn(32, generator=gen)]
    torch.testing.assert_close(K.cca_causal_conv(packed, *conv), R.cca_causal_conv(packed, *conv), atol=1e-5, rtol=1e-5)
    visible = torch.tensor([[[0, 0], [1, 0], [0, 0], [1, 0], [1, 1]]], dtype=torch.bool)
    torch.testing.assert_close(K.cca_causal_conv_segmented(packed, *conv, visible),
                               R.cca_causal_conv_segmented(packed, *conv, visible), atol=1e-5, rtol=1e-5)
    m = torch.randn(5, 7, generator=gen)
    torch.testing.assert_close(K.newton_schulz(m, 2, dtype=torch.float32), R.newton_schulz(m, 2, dtype=torch.float32), atol=1e-4, rtol=1e-4)


def test_float64_and_tensorless_calls_take_the_reference(triton_backend, monkeypatch):
    """The kernels compute in fp32: a float64 call keeps the reference's precision and dtype (cross-entropy
    came back fp32, 2e-7 off), and a call without tensors (newton_schulz_many of none) launches nothing."""
    calls = _calls(monkeypatch, "cross_entropy", "cross_entropy_partials")
    gen = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(5, 11, generator=gen, dtype=torch.float64), torch.randint(0, 11, (5,), generator=gen)
    got = K.cross_entropy(logits, labels)
    assert not calls and got.dtype == torch.float64
    torch.testing.assert_close(got, torch.nn.functional.cross_entropy(logits, labels, reduction="none"),
                               atol=1e-12, rtol=1e-12)
    ns_calls = _calls(monkeypatch, "newton_schulz", "newton_schulz_many")
    assert K.newton_schulz_many([]) == [] and not ns_calls
    K.cross_entropy(logits.float(), labels)
    assert calls                                   # fp32 still goes to the kernel


def _some_ops(gen):
    """(Triton module, its function, a call of the dispatched op) for every op the switch routes."""
    x, w, ones = torch.randn(4, 6, generator=gen), torch.randn(6, generator=gen), torch.ones(6)
    q, k = torch.randn(1, 2, 2, 8, generator=gen), torch.randn(1, 2, 1, 8, generator=gen)
    cos, sin = torch.randn(1, 2, 4, generator=gen), torch.randn(1, 2, 4, generator=gen)
    packed = torch.randn(1, 5, 32, generator=gen)
    conv = [torch.randn(32, 1, 2, generator=gen), torch.randn(32, generator=gen),
            torch.randn(32, 16, 2, generator=gen) * 0.2, torch.randn(32, generator=gen)]
    visible = torch.tensor([[[0, 0], [1, 0], [0, 0], [1, 0], [1, 1]]], dtype=torch.bool)
    m = torch.randn(5, 7, generator=gen)
    idx = torch.tensor([1, 0, 2, 1])
    return [
        ("rmsnorm", "rms_norm", lambda: K.rms_norm(x, w, 1e-5)),
        ("rmsnorm", "scaled_residual_add", lambda: K.scaled_residual_add(x, x * 2, ones, ones * 0, ones, ones * 0)),
        ("rmsnorm", "scaled_residual_add_rms_norm",
         lambda: K.scaled_residual_add_rms_norm(x, x * 2, ones, ones * 0, ones, ones * 0, w, 1e-5)),
        ("swiglu", "swiglu", lambda: K.swiglu(torch.randn(3, 10, generator=gen))),
        ("rope", "apply_partial_rope", lambda: K.apply_partial_rope(q, cos, sin)),
        ("rope", "apply_partial_rope_", lambda: K.apply_partial_rope_(q.clone(), cos, sin)),
        ("rope", "apply_partial_rope_qk_", lambda: K.apply_partial_rope_qk_(q.clone(), k.clone(), cos, sin)),
        ("moe_permute", "moe_permute", lambda: K.moe_permute(x, idx, 2)),
        ("cca_conv", "cca_causal_conv", lambda: K.cca_causal_conv(packed, *conv)),
        ("cca_conv", "cca_causal_conv_segmented", lambda: K.cca_causal_conv_segmented(packed, *conv, visible)),
        ("newton_schulz", "newton_schulz", lambda: K.newton_schulz(m, 2, dtype=torch.float32)),
        ("newton_schulz", "newton_schulz_many", lambda: K.newton_schulz_many([m, m.T.contiguous()], 2,
                                                                            dtype=torch.float32)),
    ]


@pytest.mark.parametrize("index", range(12))
def test_forced_triton_reaches_each_ops_triton_module(index, triton_backend, monkeypatch):
    """Under MEGATRON_ZAYA_KERNELS=triton each op calls its Triton module's function (spied, not replaced): a
    dispatcher that quietly took the reference would give the same numbers and lose the fused kernel."""
    module, fn, call = _some_ops(torch.Generator().manual_seed(0))[index]
    calls = _calls(monkeypatch, module, fn)
    call()
    assert calls, f"{module}.{fn}"


def test_dispatched_newton_schulz_applies_its_scale(triton_backend):
    """Muon passes scale=scale(shape): the Triton path multiplies by it as the reference does (1e-4)."""
    m = torch.randn(2, 12, 20, generator=torch.Generator().manual_seed(1))
    got = triton_backend.newton_schulz(m, 2, dtype=torch.float32, scale=0.37)
    want = R.newton_schulz(m, 2, dtype=torch.float32, scale=0.37)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_deterministic_mode_fixes_every_autotuned_kernels_config():
    """Under torch.use_deterministic_algorithms (--deterministic-mode) every autotuned kernel runs one fixed
    config, its list's last, instead of the one that timed fastest in this process: the block sizes set the order
    of the sums, so two runs of one seed could differ in the last bits (here, interpreting, each list has one)."""
    import importlib

    from triton.runtime.autotuner import Autotuner

    from megatron_zaya.kernels._triton_common import deterministic_prune
    tuned = []
    for name in ("cca_conv", "cross_entropy", "moe_permute", "newton_schulz", "rmsnorm", "rope", "swiglu"):
        module = importlib.import_module(f"megatron_zaya.kernels.triton_{name}")
        tuned += [(name, attr, fn) for attr, fn in vars(module).items() if isinstance(fn, Autotuner)]
    assert len(tuned) == 11, [t[:2] for t in tuned]
    assert all(fn.early_config_prune is deterministic_prune for _, _, fn in tuned), [
        t[:2] for t in tuned if t[2].early_config_prune is not deterministic_prune]
    configs = ["fast on one GPU", "fast on another", "fixed"]
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert deterministic_prune(configs, {}) == ["fixed"]
        torch.use_deterministic_algorithms(False)
        assert deterministic_prune(configs, {}) == configs
    finally:
        torch.use_deterministic_algorithms(before)
