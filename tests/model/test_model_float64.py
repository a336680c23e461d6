"""The model runs in float64 (bench/gpu_model_check.py's reference): no upcast rounds it to fp32.
Before norm.at_least_fp32, InputScaling and the router cast to fp32 and a float64 model failed
with "mat1 and mat2 must have the same dtype"."""
import copy

import torch

from megatron_zaya import kernels
from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel


def _loss_and_grads(model, tokens):
    model.zero_grad(set_to_none=True)
    out = model(tokens[:, :-1], labels=tokens[:, 1:])
    out.token_losses.mean().backward()
    return out, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def test_float64_model_matches_fp32_model():
    previous = kernels.kernel_backend()
    kernels.set_kernel_backend("torch")
    try:
        config = model_config_from_preset("zaya1-tiny", num_layers=2, vocab_size=256, seq_length=16)
        torch.manual_seed(0)
        model = ZayaModel(config)
        tokens = torch.randint(0, config.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
        out32, grads32 = _loss_and_grads(model, tokens)
        out64, grads64 = _loss_and_grads(copy.deepcopy(model).double(), tokens)
    finally:
        kernels.set_kernel_backend(previous)
    assert {g.dtype for g in grads64.values()} == {torch.float64}
    assert grads64.keys() == grads32.keys()
    for a, b in zip(out32.routing, out64.routing):
        assert torch.equal(a.expert_index, b.expert_index)
    # fp32 against float64: each gradient within 1e-4 relative (Frobenius), the losses within 1e-5.
    torch.testing.assert_close(out32.token_losses.double(), out64.token_losses.double(), rtol=1e-5, atol=1e-5)
    for name, g64 in grads64.items():
        error = ((grads32[name].double() - g64).norm() / g64.norm().clamp_min(1e-30)).item()
        assert error < 1e-4, (name, error)
