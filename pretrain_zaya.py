"""Pretrain a ZAYA1-style MoE language model (Megatron-style flags).

One process on CPU (the quickstart does all of this for you: bash examples/quickstart_cpu.sh):
    python pretrain_zaya.py --preset zaya1-tiny --data-path data/shakespeare_text_document \
        --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model data/tokenizer.model \
        --micro-batch-size 8 --global-batch-size 16 --seq-length 256 --train-iters 200 --lr 3e-3 \
        --lr-warmup-iters 20 --tensorboard-dir runs/tiny/tb --save runs/tiny/ckpt --save-interval 100

Several processes: launch the same command with torchrun, mpirun or srun (see docs/LAUNCH.md), e.g.
    torchrun --nproc-per-node 2 pretrain_zaya.py ... --use-distributed-optimizer
"""
from __future__ import annotations

import sys

import torch

from megatron_zaya.arguments import parse_args
from megatron_zaya.training.setup import build_and_train


def main(argv=None) -> int:
    run = parse_args(argv)          # every flag validated before any process group or allocation
    torch.manual_seed(run.train.seed)
    return build_and_train(run)


if __name__ == "__main__":
    sys.exit(main())
