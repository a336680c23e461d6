"""Every process group of a layout, built from one rank grid (Megatron's order, spec/formats.md).

Dense layers (embedding, attention, router, norms) use the grid "tp-cp-dp":

    rank = tp_rank + TP * (cp_rank + CP * dp_rank)

so tensor-parallel ranks are adjacent (same node, fastest links) and data-parallel ranks vary
slowest. The experts fold their own grid "tp-ep-edp" over the SAME ranks:

    rank = tp_rank + TP * (ep_rank + EP * expert_dp_rank)

i.e. expert parallelism runs inside DP x CP (ranks that hold different tokens), and the experts'
remaining replicas form the expert-data-parallel group. Experts are split over TP like the dense
layers (expert-TP = TP), so the EP all-to-all stays between ranks with the same tp_rank.

Gradient reduction: dense parameters over DP x CP (`dp_cp_group`), expert parameters over
expert-DP (`expert_dp_group`). The data sampler uses `dp_rank` / `dp_size`: ranks of one TP x CP
block read the same samples (CP then slices the sequence).
"""
from __future__ import annotations

import itertools

import torch.distributed as dist

from megatron_zaya.errors import UserInputError


class LayoutError(UserInputError):
    """A parallel layout that cannot be built; the message names the flag and the sizes."""


def check_layout(world_size: int, tp: int, cp: int, ep: int, model_config=None, check_vocab: bool = True) -> int:
    """Validate sizes (against the model too when given; its vocabulary unless `check_vocab` is False: a
    training run's comes later, from the tokenizer, padded to a size TP splits); returns the data-parallel
    size."""
    for name, size in (("tensor-model-parallel-size", tp), ("context-parallel-size", cp),
                       ("expert-model-parallel-size", ep)):
        if size < 1:
            raise LayoutError(f"--{name}={size}: must be >= 1")
    if world_size % (tp * cp):
        raise LayoutError(f"world size {world_size} is not divisible by --tensor-model-parallel-size={tp} "
                          f"x --context-parallel-size={cp}")
    dp = world_size // (tp * cp)
    if (dp * cp) % ep:
        raise LayoutError(f"--expert-model-parallel-size={ep} must divide data-parallel x context-parallel "
                          f"= {dp} x {cp} (EP folds over the ranks that hold different tokens)")
    if model_config is not None:
        c = model_config
        if c.num_attention_heads % tp:
            raise LayoutError(f"--tensor-model-parallel-size={tp} must divide --num-attention-heads="
                              f"{c.num_attention_heads}")
        if c.num_query_groups % tp and tp % c.num_query_groups:
            raise LayoutError(f"--tensor-model-parallel-size={tp} must divide or be a multiple of "
                              f"--num-query-groups={c.num_query_groups} (KV heads are split, or replicated "
                              f"when TP > HKV)")
        if check_vocab and c.vocab_size % tp:
            raise LayoutError(f"--tensor-model-parallel-size={tp} must divide the padded vocab {c.vocab_size} "
                              f"(a multiple of --make-vocab-size-divisible-by={c.make_vocab_size_divisible_by})")
        if c.moe_ffn_hidden_size % tp:
            raise LayoutError(f"--tensor-model-parallel-size={tp} must divide --moe-ffn-hidden-size="
                              f"{c.moe_ffn_hidden_size}")
        if c.num_experts % ep:
            raise LayoutError(f"--expert-model-parallel-size={ep} must divide --num-experts={c.num_experts}")
    return dp


def rank_grid(world_size: int, tp: int, cp: int, ep: int) -> dict[str, list[list[int]]]:
    """Rank lists of every group kind, computed without torch.distributed (printable, testable)."""
    dp = check_layout(world_size, tp, cp, ep)
    edp = dp * cp // ep

    def dense(t, c, d):
        return t + tp * (c + cp * d)

    def expert(t, e, x):
        return t + tp * (e + ep * x)

    return {
        "tp": [[dense(t, c, d) for t in range(tp)] for d in range(dp) for c in range(cp)],
        "cp": [[dense(t, c, d) for c in range(cp)] for d in range(dp) for t in range(tp)],
        "dp": [[dense(t, c, d) for d in range(dp)] for c in range(cp) for t in range(tp)],
        "dp_cp": [[dense(t, c, d) for d, c in itertools.product(range(dp), range(cp))] for t in range(tp)],
        "ep": [[expert(t, e, x) for e in range(ep)] for x in range(edp) for t in range(tp)],
        "expert_dp": [[expert(t, e, x) for x in range(edp)] for e in range(ep) for t in range(tp)],
    }


class ParallelState:
    """The groups of one layout for this rank: `<kind>_group`, `<kind>_size`, `<kind>_rank` for kind in
    tp, cp, dp, dp_cp, ep, expert_dp; plus `world_group` and `sequence_parallel`.

    Every rank must construct the same layouts in the same order (torch.distributed.new_group is
    collective). With world_size=1 no process group is needed at all."""

    KINDS = ("tp", "cp", "dp", "dp_cp", "ep", "expert_dp")

    def __init__(self, tp: int = 1, cp: int = 1, ep: int = 1, world_size: int | None = None,
                 rank: int | None = None, sequence_parallel: bool = False, model_config=None):
        initialized = dist.is_available() and dist.is_initialized()
        self.world_size = world_size if world_size is not None else (dist.get_world_size() if initialized else 1)
        self.rank = rank if rank is not None else (dist.get_rank() if initialized else 0)
        if initialized and self.world_size != dist.get_world_size():
            raise LayoutError(f"world size {self.world_size} != the process group's {dist.get_world_size()}")
        self.dp_size = check_layout(self.world_size, tp, cp, ep, model_config)
        if sequence_parallel and tp == 1:
            raise LayoutError("--sequence-parallel needs --tensor-model-parallel-size > 1")
        self.tp_size, self.cp_size, self.ep_size = tp, cp, ep
        self.sequence_parallel = sequence_parallel
        self.world_group = dist.group.WORLD if initialized else None
        self.grid = rank_grid(self.world_size, tp, cp, ep)
        for kind in self.KINDS:
            mine = None
            for ranks in self.grid[kind]:
                # new_group is collective over the whole world: every rank creates every group.
                group = dist.new_group(ranks) if initialized and self.world_size > 1 else None
                if self.rank in ranks:
                    mine = (group, ranks)
            group, ranks = mine
            setattr(self, f"{kind}_group", group)
            setattr(self, f"{kind}_ranks", ranks)
            setattr(self, f"{kind}_size", len(ranks))
            setattr(self, f"{kind}_rank", ranks.index(self.rank))
        if initialized and self.world_size > 1:
            # Bring up the world communicator now (NCCL wants every rank in the first collective of
            # a group; the CP halo's point-to-point ops run on the world group).
            dist.barrier()

    # The group whose ranks hold different tokens: routing counts and loss sums are reduced over it.
    @property
    def token_group(self):
        return self.world_group if self.sequence_parallel else self.dp_cp_group

    def describe(self) -> str:
        return (f"world {self.world_size} = TP {self.tp_size} x CP {self.cp_size} x DP {self.dp_size}; "
                f"experts: TP {self.tp_size} x EP {self.ep_size} x expert-DP {self.expert_dp_size}"
                f"{'; sequence parallel' if self.sequence_parallel else ''}")

    def __repr__(self) -> str:
        ranks = ", ".join(f"{k}={getattr(self, k + '_ranks')}" for k in self.KINDS)
        return f"ParallelState(rank {self.rank}: {self.describe()}; {ranks})"
