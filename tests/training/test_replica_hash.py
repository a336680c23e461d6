"""--check-weight-hash-across-dp-replicas-interval: DistributedRuntime.check_replicas_equal stops
every rank when data-parallel replicas hold different weights, naming them (2 gloo processes, one
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
