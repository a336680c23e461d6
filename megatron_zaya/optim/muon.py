"""Muon: momentum, then orthogonalised updates by quintic Newton-Schulz, for hidden matrices.

update = NS5(nesterov_momentum(grad)) * 0.2 * sqrt(max(m, n))
The 0.2 * sqrt(max(m, n)) factor matches the update's RMS to AdamW's typical ~0.2, so Muon shares
AdamW's learning rate and (decoupled) weight decay. That is Megatron-LM's --muon-scale-mode spectral
with --muon-extra-scale-factor 0.2; its other modes (MuonScale) are available too. A parameter of shape (..., m, n) holds
prod(...) separate m x n matrices (each expert of a grouped expert weight is its own matrix; an expert's
gate and up projections are one (2F, D) matrix, orthogonalised together as Megatron-LM's linear_fc1 is).
Newton-Schulz runs in `ns_dtype`; None (the default) picks bf16 where bf16 matmuls are native and
fp32 elsewhere (an AVX2-only CPU), per device (kernels.capability.newton_schulz_dtype).
With `tp_group` (--muon-tp-mode duplicated under TP) TP-split matrices are orthogonalised whole
(megatron_zaya/optim/muon_tp.py); without it each rank's slice is ("blockwise").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from megatron_zaya import kernels
from megatron_zaya.kernels.capability import newton_schulz_dtype
from megatron_zaya.optim.muon_tp import local_slices, tp_partition, whole_directions, whole_numel


MUON_SCALE_MODES = ("spectral", "unit_rms_norm", "shape_scaling")


@dataclass(frozen=True)
class MuonScale:
    """The factor of an orthogonalised (out, in) update, as Megatron-LM's --muon-scale-mode and
    --muon-extra-scale-factor define it: spectral sqrt(max(out, in)), unit_rms_norm sqrt(out / in),
    shape_scaling sqrt(max(1, out / in)), times `extra`. The default (spectral x 0.2) is ZAYA1's
    AdamW RMS matching; Megatron-LM's default extra factor is 1.0."""
    mode: str = "spectral"
    extra: float = 0.2

    def __post_init__(self):
        if self.mode not in MUON_SCALE_MODES:
            raise ValueError(f"--muon-scale-mode {self.mode}: choose one of {', '.join(MUON_SCALE_MODES)}")
        if not (math.isfinite(self.extra) and self.extra > 0):
            raise ValueError(f"--muon-extra-scale-factor={self.extra} must be a finite number > 0")

    def __call__(self, shape: torch.Size) -> float:
        out, inp = shape[-2], shape[-1]
        base = {"spectral": max(out, inp), "unit_rms_norm": out / inp, "shape_scaling": max(1.0, out / inp)}[self.mode]
        return self.extra * math.sqrt(base)



def momentum_direction(grad: torch.Tensor, buffer: torch.Tensor, momentum: float, nesterov: bool) -> torch.Tensor:
    """Updates `buffer` in place (buffer = momentum * buffer + grad, one pass) and returns the direction."""
    torch.add(grad, buffer, alpha=momentum, out=buffer)
    return grad.add(buffer, alpha=momentum) if nesterov else buffer.clone()


def orthogonalized_updates(directions: list[torch.Tensor], ns_steps: int, ns_dtype: torch.dtype | None,
                           scale: MuonScale = MuonScale()) -> list[torch.Tensor]:
    """Newton-Schulz on every matrix, batched: same-shape directions are stacked into one call, then
    scaled by `scale`. ns_dtype None: the device's default (bf16 where native, else fp32)."""
    by_shape: dict[tuple, list[int]] = {}
    for i, d in enumerate(directions):
        by_shape.setdefault(tuple(d.shape), []).append(i)
    results: list[torch.Tensor | None] = [None] * len(directions)
    for shape, indices in by_shape.items():
        if 0 in shape:   # an empty slice (a TP rank's share of fewer KV heads than ranks): no update
            for i in indices:
                results[i] = torch.zeros_like(directions[i])
            continue
        device = directions[indices[0]].device
        dtype = ns_dtype or newton_schulz_dtype(device)
        stacked = torch.empty((len(indices), *shape), dtype=dtype, device=device)
        for j, i in enumerate(indices):       # stacked and cast to Newton-Schulz's dtype in one pass
            stacked[j].copy_(directions[i])
        ortho = kernels.newton_schulz(stacked, steps=ns_steps, dtype=dtype, scale=scale(torch.Size(shape)))
        for j, i in enumerate(indices):
            results[i] = ortho[j]
    return results


TP_GATHER_ELEMENTS = 1 << 27      # whole matrices gathered at a time under TP (512 MiB of fp32)


def tp_orthogonalized_updates(params: list, directions: list[torch.Tensor], tp_group, ns_steps: int,
                              ns_dtype: torch.dtype | None, scale: MuonScale = MuonScale()) -> list[torch.Tensor]:
    """orthogonalized_updates of the whole TP-split matrices (gathered over `tp_group`; None: of the
    local tensors as they are), cut back to this rank's slices; the matrices TP does not split are
    orthogonalized where they are. The split ones are gathered in chunks of at most TP_GATHER_ELEMENTS
    whole elements, so the whole matrices never all exist at once; every rank of a TP group holds the
    same split matrices in the same order and cuts the same chunks (its unsplit ones may differ: under
    ZeRO-1 with sequence parallelism the routers' owners are counted over the whole world)."""
    if tp_group is None:
        return orthogonalized_updates(directions, ns_steps, ns_dtype, scale)
    updates: list[torch.Tensor | None] = [None] * len(params)
    split = [i for i, p in enumerate(params) if tp_partition(p) is not None]
    unsplit = [i for i, p in enumerate(params) if tp_partition(p) is None]
    for i, update in zip(unsplit, orthogonalized_updates([directions[i] for i in unsplit], ns_steps, ns_dtype,
                                                         scale)):
        updates[i] = update
    for lo, hi in _chunks([whole_numel(params[i]) for i in split], TP_GATHER_ELEMENTS):
        chunk = split[lo:hi]
        mine = [params[i] for i in chunk]
        whole = orthogonalized_updates(whole_directions(mine, [directions[i] for i in chunk], tp_group), ns_steps,
                                       ns_dtype, scale)
        for i, update in zip(chunk, local_slices(mine, whole, tp_group)):
            updates[i] = update
    return updates


def _chunks(sizes: list[int], limit: int) -> list[tuple[int, int]]:
    """Consecutive [lo, hi) ranges whose sizes sum to at most `limit` (a bigger item alone)."""
    out, lo, total = [], 0, 0
    for i, n in enumerate(sizes):
        if i > lo and total + n > limit:
            out.append((lo, i))
            lo, total = i, 0
        total += n
    if lo < len(sizes):
        out.append((lo, len(sizes)))
    return out


class Muon(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.95, nesterov: bool = True,
                 weight_decay: float = 0.0, ns_steps: int = 5, ns_dtype: torch.dtype | None = None,
                 tp_group=None, scale: MuonScale = MuonScale()):
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                        ns_steps=ns_steps, ns_dtype=ns_dtype)
        super().__init__(params, defaults)
        self.tp_group = tp_group
        self.scale = scale     # the run's flags, not a checkpoint's param groups
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim < 2:
                    raise ValueError(f"Muon takes matrices; got a parameter of shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            # Under a TP group every rank gathers the same matrices, with a gradient or not.
            params = group["params"] if self.tp_group is not None else [p for p in group["params"]
                                                                        if p.grad is not None]
            directions = []
            for p in params:
                if p.grad is None:
                    directions.append(torch.zeros_like(p, dtype=torch.float32))
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p, dtype=torch.float32)
                directions.append(momentum_direction(p.grad.float(), state["momentum_buffer"],
                                                     group["momentum"], group["nesterov"]))
            updates = tp_orthogonalized_updates(params, directions, self.tp_group, group["ns_steps"],
                                                group["ns_dtype"], self.scale)
            for p, update in zip(params, updates):
                if p.grad is not None:
                    apply_update(p, update, group["lr"], group["weight_decay"])
        return loss


def apply_update(param: torch.Tensor, update: torch.Tensor, lr: float, weight_decay: float) -> None:
    if weight_decay:
        param.mul_(1 - lr * weight_decay)
    param.add_(update, alpha=-lr)      # a bf16 update: PyTorch converts it on the way (one temporary)
