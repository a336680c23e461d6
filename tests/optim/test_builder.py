"""Parameter groups, the AdamW-only mode and the apex detection."""
import sys
import types

import pytest
import torch

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel
from megatron_zaya.optim.builder import (OptimizerConfig, apex_fused_adam_available, build_optimizer, muon_tp_group,
                                         split_parameters)


def tiny_model():
    torch.manual_seed(0)
    return ZayaModel(model_config_from_preset("zaya1-tiny", vocab_size=256, num_layers=2))


def test_muon_takes_hidden_matrices_and_adamw_the_rest():
    muon, decay, no_decay = split_parameters(tiny_model(), use_muon=True)
    muon_names = {n for n, _ in muon}
    assert "layers.0.attention.linear_q.weight" in muon_names
    assert "layers.1.moe.experts.gate_up_weight" in muon_names
    assert "layers.1.moe.router.fc1.weight" in muon_names
    assert {n for n, _ in decay} == {"embedding.weight", *(f"layers.{i}.attention.conv_{k}.weight"
                                                           for i in range(2) for k in ("depthwise", "grouped"))}
    assert all(p.ndim == 1 for _, p in no_decay)
    assert any(n.endswith("eda_gamma") for n, _ in no_decay) and any(n.endswith("key_temperature") for n, _ in no_decay)


def test_adamw_only_optimizer_steps_every_parameter():
    model = tiny_model()
    opt = build_optimizer(model, OptimizerConfig(optimizer="adamw", lr=1e-2))
    assert set(opt.optimizers) == {"adamw"}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    tokens = torch.randint(0, 256, (2, 16))
    model(tokens, labels=tokens).token_losses.mean().backward()
    opt.step()
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert "layers.0.attention.linear_q.weight" in changed and "embedding.weight" in changed


def test_apex_import_without_compiled_kernels_is_not_used(monkeypatch):
    fake = types.ModuleType("apex")
    fake.optimizers = types.ModuleType("apex.optimizers")
    monkeypatch.setitem(sys.modules, "apex", fake)
    monkeypatch.setitem(sys.modules, "apex.optimizers", fake.optimizers)
    monkeypatch.setitem(sys.modules, "amp_C", None)     # the compiled extension is missing
    assert apex_fused_adam_available() is False


def test_decoupled_lr_gives_the_embedding_and_output_layer_a_group_of_their_own():
    model = ZayaModel(model_config_from_preset("zaya1-tiny", vocab_size=256, num_layers=2,
                                               untie_embeddings_and_output_weights=True))
    opt = build_optimizer(model, OptimizerConfig(lr=1e-3, decoupled_lr=5e-3))
    names = {id(p): n for n, p in model.named_parameters()}
    opt.set_lr(1e-3, 5e-3)
    by_lr = {}
    for group in opt.param_groups:
        by_lr.setdefault(group["lr"], set()).update(names[id(p)] for p in group["params"])
    assert by_lr[5e-3] == {"embedding.weight", "output_layer.weight"}
    assert len(by_lr[1e-3]) == len(names) - 2
    plain = build_optimizer(model, OptimizerConfig(lr=1e-3))    # without the flag: the groups as before
    assert not any(g.get("decoupled") for g in plain.param_groups)


def test_embedding_init_method_std_sets_the_embedding_scale_and_exempts_it_from_weight_decay():
    """Megatron-LM's --embedding-init-method-std: the input embedding starts at that std (the other matrices
    keep --init-method-std) and takes no weight decay; the untied output layer still does. With
    --decoupled-lr the embedding keeps its own lr and its exemption."""
    config = model_config_from_preset("zaya1-tiny", vocab_size=1024, num_layers=2, embedding_init_method_std=1.0,
                                      untie_embeddings_and_output_weights=True)
    torch.manual_seed(0)
    model = ZayaModel(config)
    assert abs(model.embedding.weight.std().item() - 1.0) < 0.01
    assert abs(model.output_layer.weight.std().item() - 0.02) < 0.001
    assert abs(model.layers[0].attention.linear_q.weight.std().item() - 0.02) < 0.001
    names = {id(p): n for n, p in model.named_parameters()}
    for decoupled in (None, 5e-3):
        opt = build_optimizer(model, OptimizerConfig(lr=1e-3, weight_decay=0.1, decoupled_lr=decoupled,
                                                     embedding_weight_decay=False))
        opt.set_lr(1e-3, decoupled or 1e-3)
        opt.set_weight_decay(0.1)
        group_of = {names[id(p)]: g for g in opt.optimizers["adamw"].param_groups for p in g["params"]}
        assert group_of["embedding.weight"]["weight_decay"] == 0.0
        assert group_of["output_layer.weight"]["weight_decay"] == 0.1
        assert group_of["embedding.weight"]["lr"] == (decoupled or 1e-3)
    plain = build_optimizer(model, OptimizerConfig(lr=1e-3, weight_decay=0.1))
    plain.set_weight_decay(0.1)
    assert all(g["weight_decay"] == 0.1 for g in plain.optimizers["adamw"].param_groups
               if any(p is model.embedding.weight for p in g["params"]))


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_fresh_optimizer_decays_every_matrix_and_no_vector(optimizer):
    """The decay the builder sets is the one training uses (the trainer calls set_weight_decay only under
    a non-constant --weight-decay-incr-style). Independent reference: the module docstring's rule with
    decoupled decay, p <- (1 - lr * wd) p; with zero gradients and lr 1, wd 0.1 every tensor of two or
    more dimensions (Muon's matrices, the embedding, the CCA convolution kernels) becomes 0.9 x itself and
    every vector (norms, biases, scales) is unchanged, to 1e-6 relative."""
    model = tiny_model()
    opt = build_optimizer(model, OptimizerConfig(optimizer=optimizer, lr=1.0, weight_decay=0.1))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.set_lr(1.0)
    opt.step()
    for name, p in model.named_parameters():
        want = before[name] * 0.9 if p.ndim >= 2 else before[name]
        torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=1e-7, msg=name)


def test_muon_gathers_over_the_tp_group_only_in_duplicated_mode_under_tp():
    """--muon-tp-mode duplicated gathers a TP-split matrix over the TP group to orthogonalise it whole;
    blockwise orthogonalises each rank's block (no group); without TP there is nothing to gather."""
    tp2, tp1 = types.SimpleNamespace(tp_size=2, tp_group="tp-group"), types.SimpleNamespace(tp_size=1, tp_group="g")
    assert muon_tp_group(OptimizerConfig(muon_tp_mode="duplicated"), tp2) == "tp-group"
    assert muon_tp_group(OptimizerConfig(muon_tp_mode="blockwise"), tp2) is None
    for mode in ("duplicated", "blockwise"):
        assert muon_tp_group(OptimizerConfig(muon_tp_mode=mode), tp1) is None
        assert muon_tp_group(OptimizerConfig(muon_tp_mode=mode), None) is None
    with pytest.raises(ValueError, match="--muon-tp-mode=distributed: choose one of duplicated, blockwise"):
        muon_tp_group(OptimizerConfig(muon_tp_mode="distributed"), tp2)


def parse_optim_flags(*flags):
    from megatron_zaya.arguments import parse_args
    return parse_args(["--mock-data", "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "100",
                       "--train-iters", "1", "--num-layers", "1", *flags])


def test_muon_momentum_flag_reaches_muon():
    """--muon-momentum through the real argument parser: the Muon group's momentum is the flag's value
    (exact), not the 0.95 default."""
    run = parse_optim_flags("--muon-momentum", "0.8")
    opt = build_optimizer(ZayaModel(run.model), run.optim)
    assert [g["momentum"] for g in opt.optimizers["muon"].param_groups] == [0.8]


def test_adam_flags_give_the_steps_of_a_hand_built_torch_adamw():
    """--adam-beta1/--adam-beta2/--adam-eps/--weight-decay/--lr through the real parser: every AdamW group
    has those betas and eps, and three steps on random gradients equal a torch.optim.AdamW (for-loop
    implementation) built by hand on copies, decay 0.05 on tensors of two or more dimensions and 0 on
    vectors, to 1e-5 relative (fp32 rounding of the fused / foreach kernels). Three steps: Adam's first
    step is sign-like whatever the betas."""
    run = parse_optim_flags("--adam-beta1", "0.7", "--adam-beta2", "0.9", "--adam-eps", "1e-6",
                            "--weight-decay", "0.05", "--lr", "0.01")
    torch.manual_seed(0)
    model = ZayaModel(run.model)
    adamw = build_optimizer(model, run.optim).optimizers["adamw"]
    assert all(g["betas"] == (0.7, 0.9) and g["eps"] == 1e-6 for g in adamw.param_groups)
    params = [p for g in adamw.param_groups for p in g["params"]]
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    ref = torch.optim.AdamW([{"params": [c for c in copies if c.ndim >= 2], "weight_decay": 0.05},
                             {"params": [c for c in copies if c.ndim < 2], "weight_decay": 0.0}],
                            lr=0.01, betas=(0.7, 0.9), eps=1e-6, foreach=False)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        for p, c in zip(params, copies):
            p.grad = torch.randn(p.shape, generator=gen) * 1e-2
            c.grad = p.grad.clone()
        adamw.step()
        ref.step()
    for p, c in zip(params, copies):
        torch.testing.assert_close(p.detach(), c.detach(), rtol=1e-5, atol=1e-7)
