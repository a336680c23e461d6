"""Parameter groups and the optimizer set of a training run.

Muon takes the hidden matrices (attention and router linears, every expert matrix); AdamW takes the
embedding / output layer and every vector or small tensor (norms, biases, residual scales, EDA gamma,
key temperatures, the CCA convolution kernels). `--optimizer adamw` puts everything on AdamW.
Weight decay applies to every tensor of two or more dimensions (Muon's matrices, the embedding, the
CCA convolution kernels: Megatron-LM's rule), not to vectors or biases, nor to the input embedding
when --embedding-init-method-std gives it its own initial scale (as in Megatron-LM: decay would shrink
it back towards zero).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch
from torch import nn

from megatron_zaya.optim.muon import Muon, MuonScale


@dataclass
class OptimizerConfig:
    optimizer: str = "muon"            # --optimizer muon|adamw
    lr: float = 3e-4
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    muon_momentum: float = 0.95
    muon_ns_steps: int = 5             # --muon-num-ns-steps
    muon_tp_mode: str = "duplicated"   # --muon-tp-mode duplicated|blockwise (megatron_zaya/optim/muon_tp.py)
    muon_scale_mode: str = "spectral"  # --muon-scale-mode (optim/muon.py MuonScale)
    muon_extra_scale_factor: float = 0.2   # --muon-extra-scale-factor (0.2: AdamW RMS matching)
    clip_grad: float = 1.0
    decoupled_lr: float | None = None  # --decoupled-lr: the embedding and output layer in a group of their own
    embedding_weight_decay: bool = True  # False with --embedding-init-method-std (Megatron-LM's rule)


def muon_scale_of(cfg: OptimizerConfig) -> MuonScale:
    return MuonScale(cfg.muon_scale_mode, cfg.muon_extra_scale_factor)


def is_muon_param(name: str, param: nn.Parameter) -> bool:
    if param.ndim < 2:
        return False
    return not (name.startswith("embedding.") or name.startswith("output_layer.") or ".conv_" in name)


def split_parameters(model: nn.Module, use_muon: bool, embedding_weight_decay: bool = True):
    """(muon matrices, AdamW params with weight decay, AdamW params without) as lists of (name, param)."""
    muon, decay, no_decay = [], [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if use_muon and is_muon_param(name, param):
            muon.append((name, param))
        elif param.ndim >= 2 and (embedding_weight_decay or not name.startswith("embedding.")):
            decay.append((name, param))
        else:
            no_decay.append((name, param))
    return muon, decay, no_decay


def muon_bucket_key(model: nn.Module, cfg: OptimizerConfig):
    """GradientReducer's bucket_key under ZeRO-1 with Muon: whether a parameter is a Muon matrix, so
    no bucket mixes the matrices DistributedMuon updates on their owners with the AdamW parameters
    DistributedOptimizer all-gathers (both would all-gather a mixed bucket).
    None when nothing is Muon."""
    if cfg.optimizer != "muon":
        return None
    muon = {p for _, p in split_parameters(model, True)[0]}
    return lambda param: param in muon


def apex_fused_adam_available() -> bool:
    """True only when apex's compiled multi-tensor kernels import (an `import apex` alone proves nothing)."""
    try:
        importlib.import_module("amp_C")
        from apex.multi_tensor_apply import multi_tensor_applier
        from apex.optimizers import FusedAdam  # noqa: F401
    except Exception:
        return False
    return bool(getattr(multi_tensor_applier, "available", False))


def build_adamw(groups: list[dict], cfg: OptimizerConfig) -> torch.optim.Optimizer:
    params = [p for g in groups for p in g["params"]]
    kwargs = dict(lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps)
    if params and all(p.is_cuda for p in params) and apex_fused_adam_available():
        from apex.optimizers import FusedAdam
        return FusedAdam(groups, adam_w_mode=True, **kwargs)
    try:
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, foreach=True, **kwargs)


class OptimizerSet:
    """Several optimizers stepped together; the LR schedule sets every group's lr."""

    def __init__(self, optimizers: dict[str, torch.optim.Optimizer]):
        self.optimizers = optimizers

    @property
    def param_groups(self):
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    def set_lr(self, lr: float, decoupled_lr: float | None = None) -> None:
        """Every group's lr; the embedding / output-layer group's (--decoupled-lr) is `decoupled_lr`."""
        for group in self.param_groups:
            group["lr"] = decoupled_lr if group.get("decoupled") and decoupled_lr is not None else lr

    def set_weight_decay(self, weight_decay: float) -> None:
        """Every group's decay: `weight_decay` times its wd_mult (Megatron's name; 0 for vectors)."""
        for group in self.param_groups:
            group["weight_decay"] = weight_decay * group.get("wd_mult", 1.0)

    def step(self) -> None:
        for opt in self.optimizers.values():
            opt.step()

    def zero_grad(self) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)

    def owned_masters(self) -> dict:
        """ZeRO-1's fp32 masters of the weights stored below fp32, by weight: the pieces this rank owns
        (`DistributedOptimizer.owned_masters`); empty for the unsharded optimizers (fp32 weights)."""
        return {p: pieces for opt in self.optimizers.values() if hasattr(opt, "owned_masters")
                for p, pieces in opt.owned_masters().items()}

    def state_dict(self) -> dict:
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state: dict) -> None:
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state[name])


MUON_TP_MODES = ("duplicated", "blockwise")


def muon_tp_group(cfg: OptimizerConfig, pstate):
    """The TP group Muon gathers split matrices over (duplicated mode under TP), else None."""
    if cfg.muon_tp_mode not in MUON_TP_MODES:
        raise ValueError(f"--muon-tp-mode={cfg.muon_tp_mode}: choose one of {', '.join(MUON_TP_MODES)}")
    if pstate is None or pstate.tp_size == 1 or cfg.muon_tp_mode == "blockwise":
        return None
    return pstate.tp_group


def is_input_or_output_layer(name: str) -> bool:
    return name.startswith("embedding.") or name.startswith("output_layer.")


def adamw_groups(decay: list, no_decay: list, cfg: OptimizerConfig) -> list[dict]:
    """AdamW's groups: matrices with --weight-decay, vectors (and an exempt embedding) without (wd_mult 1
    and 0, as Megatron's); with --decoupled-lr the embedding and output layer form groups of their own
    ("decoupled": their own lr), with or without decay likewise."""
    def own(name: str) -> bool:
        return cfg.decoupled_lr is not None and is_input_or_output_layer(name)
    groups = ({"params": [p for n, p in decay if not own(n)], "weight_decay": cfg.weight_decay, "wd_mult": 1.0},
              {"params": [p for n, p in no_decay if not own(n)], "weight_decay": 0.0, "wd_mult": 0.0},
              {"params": [p for n, p in decay if own(n)], "weight_decay": cfg.weight_decay, "wd_mult": 1.0,
               "decoupled": True},
              {"params": [p for n, p in no_decay if own(n)], "weight_decay": 0.0, "wd_mult": 0.0, "decoupled": True})
    return [g for g in groups if g["params"]]


def build_optimizer(model: nn.Module, cfg: OptimizerConfig, pstate=None) -> OptimizerSet:
    """Unsharded optimizers; `pstate` (a ParallelState) only for Muon's TP group."""
    if cfg.optimizer not in ("muon", "adamw"):
        raise ValueError(f"--optimizer={cfg.optimizer}: choose muon or adamw")
    muon, decay, no_decay = split_parameters(model, cfg.optimizer == "muon", cfg.embedding_weight_decay)
    adam_groups = adamw_groups(decay, no_decay, cfg)
    optimizers = {"adamw": build_adamw(adam_groups, cfg)}
    if muon:
        optimizers["muon"] = Muon([p for _, p in muon], lr=cfg.lr, momentum=cfg.muon_momentum,
                                  weight_decay=cfg.weight_decay, ns_steps=cfg.muon_ns_steps,
                                  tp_group=muon_tp_group(cfg, pstate), scale=muon_scale_of(cfg))
    return OptimizerSet(optimizers)


def build_distributed_optimizer(model: nn.Module, cfg: OptimizerConfig, pstate, reducer) -> OptimizerSet:
    """ZeRO-1: AdamW on sharded fp32 masters (megatron_zaya.optim.distributed) and Muon with whole-matrix
    owners (megatron_zaya.optim.distributed_muon), both over the reducer's sharded gradient buckets.
    Muon steps first: its gathers make every replica current before AdamW's parameter all-gather."""
    from megatron_zaya.optim.distributed import DistributedOptimizer
    from megatron_zaya.optim.distributed_muon import DistributedMuon

    if cfg.optimizer not in ("muon", "adamw"):
        raise ValueError(f"--optimizer={cfg.optimizer}: choose muon or adamw")
    muon, decay, no_decay = split_parameters(model, cfg.optimizer == "muon", cfg.embedding_weight_decay)
    optimizers = {}
    if muon:
        optimizers["muon"] = DistributedMuon([p for _, p in muon], reducer, lr=cfg.lr, momentum=cfg.muon_momentum,
                                             weight_decay=cfg.weight_decay, ns_steps=cfg.muon_ns_steps,
                                             tp_group=muon_tp_group(cfg, pstate), scale=muon_scale_of(cfg))
    adam_groups = adamw_groups(decay, no_decay, cfg)
    optimizers["adamw"] = DistributedOptimizer(adam_groups, lambda groups: build_adamw(groups, cfg), pstate,
                                               reducer=reducer)
    return OptimizerSet(optimizers)
