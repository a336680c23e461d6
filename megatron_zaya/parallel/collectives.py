"""torch.distributed's flat-tensor collectives under the name the installed torch prefers.

torch 2.13 renamed all_gather_into_tensor and reduce_scatter_tensor to all_gather_single and
reduce_scatter_single; the old names still work there but warn on every call of every rank. The ROCm
and CUDA builds users install may be older and have only the old names. Both are looked up at call
time (bench/train_throughput.py times the collectives by wrapping dist.<name>)."""
from __future__ import annotations

import torch.distributed as dist


def all_gather_single(output, tensor, group=None, async_op=False):
    """Every rank's `tensor`, concatenated along dim 0 into `output`."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, tensor, group=group, async_op=async_op)


def reduce_scatter_single(output, tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    """This rank's dim-0 slice of `tensor` reduced over the group, into `output`."""
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return reduce_scatter(output, tensor, op=op, group=group, async_op=async_op)
