"""Collectives with their autograd duals (Megatron's "mappings"). Every function is the identity on
a group of one rank (or no group), so single-process runs take no communication path.

    forward                          backward
    copy_to_group       identity          all-reduce
    reduce_from_group   all-reduce        identity
    gather_along        all-gather(dim)   reduce-scatter(dim)
    reduce_scatter_along reduce-scatter   all-gather(dim)
    all_to_all          all_to_all_single all_to_all_single with the splits swapped
    send_recv           send to dst, receive from src   the reverse
    gradient_only_if    identity          the gradient, or zeros
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from megatron_zaya.parallel.collectives import all_gather_single, reduce_scatter_single


def group_size(group) -> int:
    if group is None or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def _all_gather(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    n = group_size(group)
    x = x.contiguous()
    out = x.new_empty((n * x.shape[0],) + x.shape[1:])
    all_gather_single(out, x, group=group)
    if dim == 0:
        return out
    return torch.cat(out.chunk(n, dim=0), dim=dim)


def _reduce_scatter(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    n = group_size(group)
    if dim != 0:
        x = torch.cat(x.chunk(n, dim=dim), dim=0)
    x = x.contiguous()
    out = x.new_empty((x.shape[0] // n,) + x.shape[1:])
    reduce_scatter_single(out, x, group=group)
    return out


def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    x = x.clone()
    dist.all_reduce(x, group=group)
    return x


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherAlong(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _all_gather(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.group, ctx.dim), None, None


class _ReduceScatterAlong(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _reduce_scatter(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.group, ctx.dim), None, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group):
        ctx.group, ctx.splits = group, (output_splits, input_splits)
        out = x.new_empty((sum(output_splits),) + x.shape[1:])
        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        output_splits, input_splits = ctx.splits
        out = grad.new_empty((sum(input_splits),) + grad.shape[1:])
        dist.all_to_all_single(out, grad.contiguous(), input_splits, output_splits, group=ctx.group)
        return out, None, None, None


def _exchange(sends: list, recv_like: list, dsts: list, srcs: list) -> list:
    """One batch of point-to-point ops: sends[i] goes to global rank dsts[i] and a tensor shaped
    like recv_like[i] arrives from srcs[i] (None: no peer; zeros are returned)."""
    outs = [torch.zeros_like(t) for t in recv_like]
    ops = []
    for x, dst in zip(sends, dsts):
        if dst is not None:
            ops.append(dist.P2POp(dist.isend, x.contiguous(), dst))
    for out, src in zip(outs, srcs):
        if src is not None:
            ops.append(dist.P2POp(dist.irecv, out, src))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return outs


class _SendRecv(torch.autograd.Function):
    """Several tensors each sent to dsts[i] while one arrives from srcs[i]; one autograd node, so
    its backward (the reverse exchange) runs on every rank as long as any output is used."""

    @staticmethod
    def forward(ctx, dsts, srcs, *xs):
        ctx.dsts, ctx.srcs = dsts, srcs
        return tuple(_exchange(list(xs), list(xs), dsts, srcs))

    @staticmethod
    def backward(ctx, *grads):
        # The gradient of what we received goes back to its sender; ours comes from our receiver.
        outs = _exchange(list(grads), list(grads), ctx.srcs, ctx.dsts)   # unused outputs: zero grads
        return (None, None) + tuple(outs)


class _GradGate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, keep):
        ctx.keep = keep
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return (grad if ctx.keep else torch.zeros_like(grad)), None


def gradient_only_if(x, keep: bool):
    """Identity forward; the backward passes the gradient on only where `keep` (one replica of a
    replicated computation hands its input gradient back, so it is not counted twice)."""
    return _GradGate.apply(x, keep)


def copy_to_group(x, group):
    return x if group_size(group) == 1 else _CopyToGroup.apply(x, group)


def reduce_from_group(x, group):
    return x if group_size(group) == 1 else _ReduceFromGroup.apply(x, group)


def gather_along(x, group, dim):
    return x if group_size(group) == 1 else _GatherAlong.apply(x, group, dim)


def reduce_scatter_along(x, group, dim):
    return x if group_size(group) == 1 else _ReduceScatterAlong.apply(x, group, dim)


def all_to_all(x, output_splits: list[int], input_splits: list[int], group):
    return x if group_size(group) == 1 else _AllToAll.apply(x, output_splits, input_splits, group)


def send_recv(xs: list, dsts: list, srcs: list) -> tuple:
    """Differentiable point-to-point exchange: xs[i] goes to global rank dsts[i], the i-th result is
    what srcs[i] sent (zeros when srcs[i] is None). Every rank of the exchange calls it with the
    same number of tensors, so that the backward exchanges line up."""
    return _SendRecv.apply(list(dsts), list(srcs), *xs)
