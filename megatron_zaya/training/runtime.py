"""What the training loop needs from the process layout, behind one small interface.

`SingleProcess` is the plain case; `megatron_zaya.training.distributed_runtime` implements the same
methods over the parallel package's process groups."""
from __future__ import annotations

import contextlib
import math

import torch

from megatron_zaya.parallel import data as data_parallel
from megatron_zaya.parallel.state import ParallelState


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
        self.layout = ParallelState(world_size=1, rank=0)   # for the gradient helpers shared with many ranks

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
        """The gradient norm, and the gradients scaled to max_norm when above it: parallel.data's clip over
        a one-rank layout, the same code as on many ranks."""
        return data_parallel.clip_grad_norm(list(self.model.parameters()), max_norm, self.layout).item()

    def count_zero_grads(self) -> int:
        return data_parallel.count_zero_grads(self.model.parameters(), self.layout, self.device)

    def params_norm(self, masters: dict | None = None) -> float:
        """The weights' norm; of their fp32 masters where ZeRO-1 keeps them (`OptimizerSet.owned_masters`), as
        Megatron-LM reports it, not of the bf16 rounding."""
        # (no float64 copy of every weight: sum_of_squares sums fp32 rows in fp64, the gradient clip's way)
        masters = masters or {}
        squares = torch.stack([data_parallel.sum_of_squares(values) for p in self.model.parameters()
                               for _, _, values in masters.get(p, [(0, p.numel(), p.detach())])])
        return math.sqrt(squares.double().sum().item())      # one device sync, not one per parameter

    def check_replicas_equal(self) -> None:
        pass      # one process: no data-parallel replica to compare with

    def barrier(self) -> None:
        pass
