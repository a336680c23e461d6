"""Whether a run without a GPU can hold its model in this machine's memory, checked with the flags, before
anything is built: a GPU config started on a CPU machine (a login node, a laptop) otherwise allocates its
model in host memory until the kernel's OOM killer ends it, one rank after another."""
from __future__ import annotations

import os

from megatron_zaya.data.index_builders import physical_memory_bytes
from megatron_zaya.errors import UserInputError

# The least a training rank holds per parameter of its share (no optimizer state, no activations: a lower
# bound, so that no run that fits is refused): its fp32 gradient and its weight, fp32, or bf16 under --bf16
# with the distributed optimizer (whose fp32 masters are sharded over the data-parallel ranks).
def bytes_per_parameter(bf16_weights: bool) -> int:
    return 4 + (2 if bf16_weights else 4)


def parameters_per_rank(config, tensor_parallel: int, expert_parallel: int) -> int:
    """A lower bound of the parameters one rank holds, from the config alone (no model is built): its share
    of the attention projections and of the experts, most of a ZAYA model (the embedding aside: its
    vocabulary is the tokenizer's, not known yet)."""
    from megatron_zaya.model.accounting import matmul_macs_per_token
    macs = matmul_macs_per_token(config)     # a weight's elements are its MACs per token (one expert each)
    experts = macs["active_expert"] * config.num_experts
    return macs["attention_projections"] // tensor_parallel + experts // (expert_parallel * tensor_parallel)


def check_host_memory(config, tensor_parallel: int, expert_parallel: int, local_ranks: int, source: str,
                      bf16_weights: bool = False, limit: int | None = None) -> None:
    """UserInputError when the `local_ranks` ranks of this machine cannot hold their parameters' weights and
    gradients in its memory (`limit`, default its physical memory). `source`: the flag that chose the model;
    `bf16_weights`: --bf16 with --use-distributed-optimizer."""
    limit = physical_memory_bytes() if limit is None else limit
    per_rank = parameters_per_rank(config, tensor_parallel, expert_parallel)
    need = per_rank * bytes_per_parameter(bf16_weights) * local_ranks
    if limit is not None and need > limit:
        raise UserInputError(
            f"{source}: torch sees no GPU, and {local_ranks} rank(s) of {per_rank / 1e9:.2f}B parameters each "
            f"(attention and experts) need at least {need / 2**30:,.0f} GiB for their weights and fp32 gradients, "
            f"more than this machine's {limit / 2**30:,.0f} GiB: run it on GPUs, or train a smaller --preset on "
            f"CPU (zaya1-tiny, zaya1-100m)")


def ranks_on_this_machine(env=None) -> int:
    """The launcher's count of this machine's ranks (torchrun, Open MPI, MPICH), else 1."""
    env = os.environ if env is None else env
    for name in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        if env.get(name, "").isdigit() and int(env[name]) > 0:
            return int(env[name])
    return 1
