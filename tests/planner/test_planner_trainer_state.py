"""The planner's weights, gradients and optimizer bytes against the trainer's own ZeRO-1 with bf16
weights (`--bf16 --use-distributed-optimizer`: DistributedRuntime, 2 gloo processes, one real step).

Exact: the weights (bf16, routers fp32), the fp32 gradient buckets (less the < N padding elements
per bucket the reduce-scatter needs), and the fp32 masters of the bf16 weights (an fp32 weight is its
own master: no copy) + optimizer state (AdamW's moments and 4-byte step counter per master piece;
Muon's momentum and master) summed over the ranks. Per rank: AdamW's shards are the planner's (the
trainer's buckets run in reverse model order, so rank 0 holds what the planner gives rank 1); Muon
gives whole matrices to owners, as the planner does (`muon_owner_loads`): per rank within 1e-4 (AdamW's
shard boundaries, above). Measured 2026-12-04: AdamW [3161620, 3161496] B against the planner's
[3161496, 3161620]; 2026-12-06: Muon [2792288, 1736088] B against [2792216, 1736160] (a flat cut, as the
planner once did: [2362192, 2166184])."""
import json

import pytest

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.planner.layout import ParallelLayout
from megatron_zaya.planner.memory import state_memory
from tests.parallel.parallel_launcher import run_torchrun
from tests.planner.trainer_state_worker import CONFIG


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_trainer_zero1_bf16_state_is_the_planners(optimizer):
    proc = run_torchrun(2, "tests/planner/trainer_state_worker.py", optimizer)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = json.loads(proc.stdout.strip().splitlines()[-1])
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
