"""Worker of test_replica_hash.py: DistributedRuntime.check_replicas_equal on 2 gloo processes
(DP=2), or on 4 with --tp 2 (DP=2 x TP=2: two replica groups), before and after rank 1 changes one
element of one weight. Rank 0 prints one JSON line: per rank, the second check's error.

    torchrun --nproc-per-node 2 tests/training/replica_hash_worker.py
    torchrun --nproc-per-node 4 tests/training/replica_hash_worker.py --tp 2
"""
import argparse

import torch

from megatron_zaya.arguments import ParallelSizes, RunConfig
from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel
from megatron_zaya.optim.builder import OptimizerConfig
from megatron_zaya.training.config import TrainConfig
from megatron_zaya.training.distributed_runtime import DistributedRuntime
from tests.parallel.parallel_launcher import report_from_rank0_and_exit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1)
    tp = parser.parse_args().tp
    model_config = model_config_from_preset("zaya1-tiny", num_layers=1, vocab_size=512, seq_length=32)
    run = RunConfig(model_config, TrainConfig(micro_batch_size=1, global_batch_size=2, train_iters=1),
                    OptimizerConfig(), ParallelSizes(2 * tp, tp), None, argparse.Namespace(distributed_backend="gloo"))
    runtime = DistributedRuntime(run)
    torch.manual_seed(0)
    model = runtime.prepare_model(ZayaModel(model_config))
    runtime.check_replicas_equal()          # identical replicas: passes on every rank
    if runtime.rank == 1:
        with torch.no_grad():
            dict(model.named_parameters())["layers.0.moe.experts.down_weight"].view(-1)[7] += 1e-3
    try:
        runtime.check_replicas_equal()
        error = None
    except RuntimeError as err:
        error = str(err)
    report_from_rank0_and_exit(runtime, error)


if __name__ == "__main__":
    main()
