"""Which rank and which layer produced a non-finite loss or gradient (run only for a skipped step).

Gradients are summed across ranks before the loop sees them: afterwards every rank holds the same
NaNs and the first non-finite parameter is just the first in the model's order (the embedding). So
`diagnose` re-runs one micro-batch of the step on every rank, the same index on all (the first with a
non-finite loss on any rank, else the last; the forward may hold collectives: all ranks take part, as they
all skip the step), with a purely local backward (no gradient reduction):

  - forward hooks on the embedding, each block and the final norm: the first whose output is not finite;
  - gradient hooks on every parameter, in the order backward reaches them: the first non-finite one;
  - plus the rank's own (pre-reduction) loss of the whole step, and its first micro-batch with a non-finite loss.

Each rank's four numbers are gathered (an all-reduce MAX of world_size x 4 scalars), so every rank
prints the same diagnosis naming the rank(s) and layer(s). The normal step pays nothing for this.
"""
from __future__ import annotations

import math

import torch

from megatron_zaya.training.runtime import nonfinite_gradients


def _modules(model) -> list[tuple[str, torch.nn.Module]]:
    named = [("embedding", getattr(model, "embedding", None))]
    named += [(f"layers.{i}", block) for i, block in enumerate(model.layers)]
    named.append(("final_norm", getattr(model, "final_norm", None)))
    return [(name, m) for name, m in named if m is not None]


def _first_bad(flags: list[torch.Tensor]) -> int:
    """Index of the first False of a list of boolean scalars (one sync), or -1."""
    if not flags:
        return -1
    bad = (~torch.stack(flags)).nonzero()
    return int(bad[0].item()) if len(bad) else -1


def _local_rerun(trainer, batch: dict, loss_scale: float) -> tuple[int, int]:
    """(index of the first module with a non-finite output, index in named_parameters() of the first
    parameter whose local gradient went non-finite during backward), -1 for none."""
    from megatron_zaya.training.loop import model_inputs
    model, parallel = trainer.model, trainer.parallel
    modules = _modules(model)
    outputs, grads = [], []   # device booleans, in the order the hooks fire (no sync inside the hooks)

    def on_output(index):
        def hook(module, inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            outputs.append((index, torch.isfinite(out).all()))
        return hook

    def on_grad(index):
        def hook(grad):
            grads.append((index, torch.isfinite(grad).all()))
        return hook

    handles = [m.register_forward_hook(on_output(i)) for i, (_, m) in enumerate(modules)]
    handles += [p.register_hook(on_grad(i)) for i, (_, p) in enumerate(model.named_parameters()) if p.requires_grad]
    trainer.optimizer.zero_grad()
    parallel.zero_grad()
    devices = [trainer.device] if trainer.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), parallel.no_sync(True):
            with trainer.autocast:
                out = model(**model_inputs(batch))
            ((out.token_losses * batch["loss_mask"]).sum() * loss_scale).backward()
    finally:
        for h in handles:
            h.remove()
        trainer.optimizer.zero_grad()
        parallel.zero_grad()
    first_output = _first_bad([flag for _, flag in outputs])
    first_grad = _first_bad([flag for _, flag in grads])
    return (outputs[first_output][0] if first_output >= 0 else -1,
            grads[first_grad][0] if first_grad >= 0 else -1)


def micro_batch_to_rerun(parallel, finite_losses: list[torch.Tensor]) -> tuple[int, int]:
    """(the micro-batch every rank re-runs, this rank's first with a non-finite loss or -1). The re-run is
    the same on all ranks (the forward holds collectives): the first micro-batch whose loss was non-finite
    on any rank, else the last (a gradient-only non-finite value). With gradient accumulation a bad
    sample's NaN is most often in another micro-batch than the last."""
    count = len(finite_losses)
    own = next((i for i, finite in enumerate(finite_losses) if not bool(finite)), count)
    first = -int(parallel.max_over_all_ranks(torch.tensor([-own], dtype=torch.float64)).item())
    return (first if first < count else count - 1), (own if own < count else -1)


def diagnose(trainer, micro_batches: list[dict], loss_scale: float, local_loss: torch.Tensor,
             finite_losses: list[torch.Tensor]) -> str:
    """Called on every rank for a skipped step, before its gradients are cleared: re-runs the micro-batch
    micro_batch_to_rerun picks and names, for each rank, where its non-finite values came from."""
    model, parallel = trainer.model, trainer.parallel
    rerun, own_first = micro_batch_to_rerun(parallel, finite_losses)
    reduced_bad = nonfinite_gradients(model)
    loss_finite = bool(torch.isfinite(local_loss).item())
    first_output, first_grad = _local_rerun(trainer, micro_batches[rerun], loss_scale)
    world = parallel.world_size
    mine = torch.full((world, 4), -math.inf, dtype=torch.float64)
    mine[parallel.rank] = torch.tensor([float(loss_finite), first_output, first_grad, own_first],
                                       dtype=torch.float64)
    gathered = parallel.max_over_all_ranks(mine).cpu().tolist()   # an all-gather of 4 scalars per rank

    module_names = [name for name, _ in _modules(model)]
    param_names = [name for name, _ in model.named_parameters()]
    reports = []
    for rank, (finite, output, grad, own) in enumerate(gathered):
        parts = [] if finite else ["loss non-finite"]
        if output >= 0:
            parts.append(f"first non-finite output: {module_names[int(output)]}")
        elif not finite and own >= 0 and own != rerun:    # another rank's earlier micro-batch was re-run
            parts.append(f"in its micro-batch {int(own)} (not re-run: micro-batch {rerun} was, the first non-finite "
                         f"on any rank)")
        elif not finite:
            parts.append("every block's output finite (the head or the loss)")
        if grad >= 0 and not parts:     # else a consequence of the forward
            parts.append(f"first non-finite local gradient: {param_names[int(grad)]}")
        if parts:
            reports.append((rank, ", ".join(parts)))
    if not reports:
        return (f"rank {parallel.rank}: not reproduced by a local re-run of a micro-batch on any rank; "
                f"after the gradient reduction non-finite in {reduced_bad[:8]}")
    return (f"non-finite produced on rank(s) {[r for r, _ in reports][:16]}: "
            + "; ".join(f"rank {r}: {text}" for r, text in reports[:8]))
