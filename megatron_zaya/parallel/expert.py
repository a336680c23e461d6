"""Expert parallelism: experts sharded over the EP group, tokens exchanged by an all-to-all
dispatcher, dropless, with uneven split sizes (all_to_all_single, which gloo also handles).

Per MoE layer and micro-batch, on every rank:
  1. permute local tokens by expert (skip-class tokens leave here: they cost nothing);
  2. exchange the per-expert counts (a small all-to-all), then the tokens (all_to_all_single with
     uneven splits): rank j receives, from every rank, the tokens of j's local experts;
  3. sort the received tokens by local expert, run the grouped experts, unsort;
  4. the reverse all-to-all, then un-permute weighted by each token's gate.
Under TP (expert-TP = TP) each TP rank does the same exchange with its FFN slice; the gate is
applied after the all-reduce over TP so the replicated router sees the full expert output. Under
sequence parallelism the router runs on each rank's S/TP tokens; tokens and choices are
all-gathered for the experts and the outputs reduce-scattered back before the gates.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from megatron_zaya import kernels
from megatron_zaya.model.moe import MoELayer
from megatron_zaya.model.router import Routing
from megatron_zaya.parallel.mappings import (all_to_all, copy_to_group, gather_along, reduce_from_group,
                                             reduce_scatter_along)
from megatron_zaya.parallel.tensor import split_parameter


def split_experts(experts, ep: int, rank: int) -> None:
    local = experts.num_experts // ep
    pieces = [[(r * local, (r + 1) * local)] for r in range(ep)]
    split_parameter(experts, "gate_up_weight", "ep", 0, pieces, rank)
    split_parameter(experts, "down_weight", "ep", 0, pieces, rank)
    experts.num_experts = local


class ParallelMoE(MoELayer):
    pstate = None

    def forward(self, x, router_state):
        ps = self.pstate
        if ps.sequence_parallel:
            return self._forward_sequence_parallel(x, router_state)
        b, s, d = x.shape
        routing, router_state = self.router(x, router_state)
        tokens = copy_to_group(x.reshape(b * s, d), ps.tp_group)
        if ps.tp_size == 1:
            out = self.dispatch_and_combine(tokens, routing)
        else:
            ones = Routing(routing.expert_index, torch.ones_like(routing.gate), routing.counts, routing.probs)
            out = reduce_from_group(self.dispatch_and_combine(tokens, ones), ps.tp_group)
            out = out * routing.gate.unsqueeze(-1).to(out.dtype)
        return out.view(b, s, d), router_state, routing

    def _forward_sequence_parallel(self, x, router_state):
        """x (B, S/TP, D): route the local tokens, gather tokens and choices over TP, run the FFN
        slices on all of them, reduce-scatter back, then apply the local gates."""
        ps = self.pstate
        b, s_local, d = x.shape
        routing, router_state = self.router(x, router_state)
        tokens = gather_along(x, ps.tp_group, 1)
        with torch.no_grad():
            index = gather_along(routing.expert_index.view(b, s_local), ps.tp_group, 1).reshape(-1)
        ones = Routing(index, torch.ones(index.shape, dtype=routing.gate.dtype, device=index.device), None, None)
        partial = self.dispatch_and_combine(tokens.reshape(-1, d), ones).view(b, -1, d)
        out = reduce_scatter_along(partial, ps.tp_group, 1)
        return out * routing.gate.view(b, s_local, 1).to(out.dtype), router_state, routing

    def dispatch_and_combine(self, tokens, routing):
        ps = self.pstate
        if ps.ep_size == 1:
            return super().dispatch_and_combine(tokens, routing)
        ep, local = ps.ep_size, self.experts.num_experts
        permuted, order, counts = kernels.moe_permute(tokens, routing.expert_index, self.num_experts)
        received_counts = torch.empty_like(counts)
        dist.all_to_all_single(received_counts, counts.contiguous(), group=ps.ep_group)
        send_splits = counts.view(ep, local).sum(1).tolist()
        recv_splits = received_counts.view(ep, local).sum(1).tolist()
        received = all_to_all(permuted, recv_splits, send_splits, ps.ep_group)
        # Received rows are grouped by source rank, then expert: regroup by local expert.
        expert_of_row = torch.arange(local, device=counts.device).repeat(ep).repeat_interleave(
            received_counts, output_size=sum(recv_splits))      # (the size known on the host: no device sync)
        by_expert = torch.argsort(expert_of_row, stable=True)
        output = self.experts(received.index_select(0, by_expert), received_counts.view(ep, local).sum(0))
        output = output.index_select(0, torch.argsort(by_expert))
        returned = all_to_all(output, send_splits, recv_splits, ps.ep_group)
        return kernels.moe_unpermute(returned, order, routing.gate, tokens.shape[0])


def apply_expert_parallel(model, pstate) -> None:
    for block in model.layers:
        if pstate.ep_size > 1:
            split_experts(block.moe.experts, pstate.ep_size, pstate.ep_rank)
        block.moe.__class__ = ParallelMoE
        block.moe.pstate = pstate
