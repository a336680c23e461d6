"""The planner's weights, gradients and optimizer bytes against the trainer's own ZeRO-1 with bf16
weights (`--bf16 --use-distributed-optimizer`: DistributedRuntime, 2 gloo processes, one real step), and
against its plain data parallelism (`--bf16` alone), which keeps fp32 weights, their own masters.

Exact: the weights (bf16, routers fp32), the fp32 gradient buckets (less the < N padding elements
per bucket the reduce-scatter needs), and the fp32 masters of the bf16 weights (an fp32 weight is its
own master: no copy) + optimizer state (AdamW's moments and 4-byte step counter per master piece;
Muon's momentum and master) summed over the ranks. Per rank: AdamW's shards are the planner's (the
trainer's buckets run in reverse model order, so rank 0 holds what the planner gives rank 1); Muon
gives whole matrices to owners, as the planner does (`muon_owner_loads`): per rank within 1e-4 (AdamW's
shard boundaries, above). Measured 2026-12-04: AdamW [3161620, 3161496] B against the planner's
[3161496, 3161620]; 2026-12-06: Muon [2792288, 1736088] B against [2792216, 1736160] (a flat cut, as the
planner once did: [2362192, 2166184]).

Without ZeRO-1, exact on every rank: fp32 weights, fp32 gradient buckets, and the optimizer's state alone
(AdamW's moments and step counters; Muon's momentum of the matrices, AdamW's state for the rest). Measured
2026-12-07: AdamW 2,116,232 + 2,116,232 + 4,232,600 B, Muon the same + 2,437,868 B (the planner once counted
bf16 weights and fp32 masters: 1,070,980 and 6,323,104 B for AdamW)."""
import json

import pytest

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.planner.layout import ParallelLayout
from megatron_zaya.planner.memory import state_memory
from tests.parallel.parallel_launcher import run_torchrun
from tests.planner.trainer_state_worker import CONFIG


def trainer_state(optimizer: str, mode: str) -> list[dict]:
    """Each rank's bytes after one step of the trainer (trainer_state_worker.py) on 2 processes."""
    proc = run_torchrun(2, "tests/planner/trainer_state_worker.py", optimizer, mode)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_trainer_zero1_bf16_state_is_the_planners(optimizer):
    ranks = trainer_state(optimizer, "zero1")
    config = model_config_from_preset("zaya1-tiny", **CONFIG)
    layout = ParallelLayout(gpus=2, seq_length=32, micro_batch_size=1, global_batch_size=2, zero1=True).validate(config)
    planned = state_memory(config, layout, optimizer)
    for rank in ranks:
        assert rank["dtypes"] == ["torch.bfloat16", "torch.float32"]
        assert rank["weights"] == planned.weights
        assert rank["gradients"] - rank["padding"] == planned.gradients
    measured = [rank["optimizer"] for rank in ranks]
    assert sum(measured) == sum(planned.optimizer_per_rank), (measured, planned.optimizer_per_rank)
    if optimizer == "adamw":
        assert sorted(measured) == sorted(planned.optimizer_per_rank)
    else:     # Muon's whole matrices on their owners, as the trainer picks them; AdamW's shards as above
        for got, want in zip(measured, planned.optimizer_per_rank):
            assert abs(got - want) <= 1e-4 * want, (measured, planned.optimizer_per_rank)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_trainer_plain_data_parallel_fp32_state_is_the_planners(optimizer):
    ranks = trainer_state(optimizer, "plain")
    config = model_config_from_preset("zaya1-tiny", **CONFIG)
    layout = ParallelLayout(gpus=2, seq_length=32, micro_batch_size=1, global_batch_size=2).validate(config)
    planned = state_memory(config, layout, optimizer)
    for rank in ranks:
        assert rank["dtypes"] == ["torch.float32"]
        assert (rank["weights"], rank["gradients"] - rank["padding"], rank["optimizer"]) == \
            (planned.weights, planned.gradients, planned.optimizer)
