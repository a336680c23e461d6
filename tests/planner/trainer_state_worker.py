"""Worker of test_planner_trainer_state.py: one real training step of the trainer under --bf16
(DistributedRuntime, 2 gloo processes), with its own ZeRO-1 (--use-distributed-optimizer: bf16 weights) or
without (fp32 weights, plain data parallelism), then the bytes each rank holds: weights, gradient buckets
(and their padding), master weights + optimizer state. Rank 0 prints them all as one JSON line.

    torchrun --nproc-per-node 2 tests/planner/trainer_state_worker.py adamw|muon zero1|plain
"""
import argparse
import sys

import torch

from megatron_zaya.arguments import ParallelSizes, RunConfig
from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel
from megatron_zaya.optim.builder import OptimizerConfig
from megatron_zaya.optim.distributed import DistributedOptimizer
from megatron_zaya.training.config import TrainConfig
from megatron_zaya.training.distributed_runtime import DistributedRuntime
from megatron_zaya.training.loop import Trainer
from tests.parallel.parallel_launcher import report_from_rank0_and_exit

CONFIG = dict(num_layers=1, vocab_size=512, seq_length=32)


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))


def main() -> None:
    optimizer_name, zero1 = sys.argv[1], sys.argv[2] == "zero1"
    model_config = model_config_from_preset("zaya1-tiny", **CONFIG)
    train = TrainConfig(micro_batch_size=1, global_batch_size=2, train_iters=1, bf16=True, eval_iters=0)
    run = RunConfig(model_config, train, OptimizerConfig(optimizer=optimizer_name, lr=1e-3),
                    ParallelSizes(2, use_distributed_optimizer=zero1), None,
                    argparse.Namespace(distributed_backend="gloo"))
    runtime = DistributedRuntime(run)
    torch.manual_seed(0)
    model = runtime.prepare_model(ZayaModel(model_config))
    optimizer = runtime.build_optimizer(model, run.optim)
    trainer = Trainer(run, model, optimizer, runtime, None, None, logger=None)
    generator = torch.Generator().manual_seed(1 + runtime.rank)
    tokens = torch.randint(0, model_config.vocab_size, (1, model_config.seq_length), generator=generator)
    batch = {"tokens": tokens, "labels": tokens.roll(-1, 1), "loss_mask": torch.ones(tokens.shape),
             "position_ids": torch.arange(model_config.seq_length).unsqueeze(0)}
    trainer.train_step([batch])

    buckets = runtime.reducer.buckets
    state = 0
    for opt in optimizer.optimizers.values():
        if isinstance(opt, DistributedOptimizer):
            # masters with memory of their own (an fp32 weight's piece is a view of the weight)
            state += tensor_bytes(m for p, _, _, m in opt.pieces
                                  if m.untyped_storage().data_ptr() != p.untyped_storage().data_ptr())
            state += sum(tensor_bytes(s.values()) for s in opt.inner.state.values()) if opt.inner else 0
        else:      # DistributedMuon: momentum and master of the matrices this rank owns; without ZeRO-1 the
            # state of every weight (its own master)
            state += sum(tensor_bytes(s.values()) for s in opt.state.values())
    mine = {"weights": tensor_bytes(model.parameters()),
            "gradients": tensor_bytes(b.buffer for b in buckets),
            "padding": sum((b.buffer.numel() - sum(p.numel() for p in b.params)) * b.buffer.element_size()
                           for b in buckets),
            "optimizer": state,
            "dtypes": sorted({str(p.dtype) for p in model.parameters()})}
    report_from_rank0_and_exit(runtime, mine)


if __name__ == "__main__":
    main()
