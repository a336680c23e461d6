"""--check-weight-hash-across-dp-replicas-interval: DistributedRuntime.check_replicas_equal stops
every rank when data-parallel replicas hold different weights, naming them (2 gloo processes, or 4 as DP=2 x TP=2, one
expert weight changed by 1e-3 in one element on rank 1). That real runs keep identical replicas is
checked by test_distributed_training.py's ZeRO-1 bf16 run, which compares them after every step."""
import json

from tests.parallel.parallel_launcher import run_torchrun


def test_a_replica_out_of_sync_stops_every_rank_naming_the_weight():
    proc = run_torchrun(2, "tests/training/replica_hash_worker.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(errors) == 2
    for rank, error in enumerate(errors):
        assert error is not None and f"replicas are out of sync on rank {rank}" in error, error
        assert "1 weights differ among this rank's replicas, e.g. layers.0.moe.experts.down_weight" in error, error


def test_every_rank_stops_when_only_another_replica_group_differs():
    """DP=2 x TP=2: ranks 1 and 3 hold one replica group, 0 and 2 the other. Rank 1's change stops all
    four; 0 and 2, whose own replicas agree, point to the other group's errors."""
    proc = run_torchrun(4, "tests/training/replica_hash_worker.py", "--tp", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(errors) == 4
    for rank, error in enumerate(errors):
        assert error is not None and f"replicas are out of sync on rank {rank}" in error, error
        own_group_differs = rank in (1, 3)
        assert ("1 weights differ among this rank's replicas, e.g. layers.0.moe.experts.down_weight" in error) \
            == own_group_differs, error
        assert ("weights differ on another replica group" in error) == (not own_group_differs), error
