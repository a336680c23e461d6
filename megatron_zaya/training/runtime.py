"""What the training loop needs from the process layout, behind one small interface.

`SingleProcess` is the plain case; `megatron_zaya.training.distributed_runtime` implements the same
methods over the parallel package's process groups."""
from __future__ import annotations

import contextlib
import math

import torch

from megatron_zaya.parallel.data import sum_of_squares


def place_on(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`model` on `device`: moved there, or, built on the meta device (its weights to be loaded from a
    checkpoint), allocated there uninitialised, never on the host first. The markers the parallel
    package sets on tensors (partitions, is_expert, ...) stay: to_empty makes new Parameter objects."""
    tensors = lambda: list(model.named_parameters()) + list(model.named_buffers())   # noqa: E731
    if not any(t.is_meta for _, t in tensors()):
        return model.to(device)
    markers = {name: dict(vars(t)) for name, t in tensors()}
    model.to_empty(device=device)
    for name, t in tensors():
        vars(t).update(markers[name])
    return model


def nonfinite_gradients(model: torch.nn.Module) -> list[str]:
    return [name for name, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]


class SingleProcess:
    rank = 0
    world_size = 1
    dp_rank = 0
    dp_size = 1
    is_main = True
    gradient_average_factor = 1.0

    def __init__(self, device: torch.device | None = None):
        self.model = None
        self.device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        self.model = place_on(model, self.device)
        return self.model

    def build_optimizer(self, model: torch.nn.Module, optim_config):
        from megatron_zaya.optim.builder import build_optimizer
        return build_optimizer(model, optim_config)

    def sum_over_data_ranks(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def max_over_all_ranks(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def gather_from_all_ranks(self, value: float) -> list[float]:
        return [value]

    def sum_routing_counts(self, counts: torch.Tensor) -> torch.Tensor:
        return counts

    def local_batch(self, batch: dict) -> dict:
        return batch

    def zero_grad(self) -> None:
        pass

    def no_sync(self, skip: bool):
        return contextlib.nullcontext()

    def finish_gradient_reduction(self) -> None:
        pass

    def clip_grad_norm(self, max_norm: float) -> float:
        """The global gradient norm (sum_of_squares: torch's norm drifts on large CPU tensors), and the
        gradients scaled to max_norm when above it (clip_grads_with_norm_ takes the parameters and scales
        their .grad; handed the gradient tensors themselves, it scales nothing)."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = (torch.stack([sum_of_squares(p.grad) for p in params]).sum().sqrt() if params
                else torch.zeros((), device=self.device))
        if max_norm and max_norm > 0 and torch.isfinite(norm):   # non-finite: leave grads for the diagnosis
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return norm.item()

    def count_zero_grads(self) -> int:
        zeros = [(p.grad == 0).sum() for p in self.model.parameters() if p.grad is not None]
        return int(torch.stack(zeros).sum().item()) if zeros else 0

    def params_norm(self) -> float:
        squares = torch.stack([p.detach().double().pow(2).sum() for p in self.model.parameters()])
        return math.sqrt(squares.sum().item())      # one device sync, not one per parameter

    def check_replicas_equal(self) -> None:
        pass      # one process: no data-parallel replica to compare with

    def barrier(self) -> None:
        pass
