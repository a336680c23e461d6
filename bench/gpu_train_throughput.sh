#!/usr/bin/env bash
# Training throughput on ONE GPU: a ZAYA1-base-shaped model with fewer layers (preset zaya1-base-4l:
# D 2048, 8/2 CCA heads, 16 experts of F 2048, vocab 262272, 4 blocks), bf16 autocast, the fused Triton
# kernels on (MEGATRON_ZAYA_KERNELS=triton fails loudly if they cannot load), Muon + AdamW, the real
# Trainer.train_step. Prints tokens/s, model TFLOP/s, MFU (vs the vendor bf16 peak and vs a measured
# bf16/fp32 matmul peak), the time split and peak memory; writes the JSON next to it.
#
#   bash bench/gpu_train_throughput.sh                       # defaults below
#   SEQ=4096 MICRO=2 GLOBAL=8 ITERS=10 bash bench/gpu_train_throughput.sh
#   LAYERS=8 bash bench/gpu_train_throughput.sh             # more blocks, same shapes
#   DOCUMENT_LENGTH=512 bash bench/gpu_train_throughput.sh  # packed documents (--reset-attention-mask)
# Target (issue 9): 40% MFU or more on an H200.
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${PRESET:-zaya1-base-4l}
SEQ=${SEQ:-4096}
MICRO=${MICRO:-2}
GLOBAL=${GLOBAL:-$MICRO}
WARMUP=${WARMUP:-3}
ITERS=${ITERS:-10}
OUT=${OUT:-bench_gpu_train_throughput.json}
EXTRA=()
[[ -n "${LAYERS:-}" ]] && EXTRA+=(--num-layers "$LAYERS")
[[ -n "${PROFILE:-}" ]] && EXTRA+=(--profile "$PROFILE")
[[ -n "${DOCUMENT_LENGTH:-}" ]] && EXTRA+=(--document-length "$DOCUMENT_LENGTH")   # packed documents
${PYTHON:-python3} -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no GPU visible to torch')"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>/dev/null || rocm-smi 2>/dev/null || true
MEGATRON_ZAYA_KERNELS=${MEGATRON_ZAYA_KERNELS:-triton} ${PYTHON:-python3} bench/train_throughput.py \
    --preset "$PRESET" --seq-length "$SEQ" --micro-batch-size "$MICRO" --global-batch-size "$GLOBAL" \
    --bf16 --optimizer muon --warmup "$WARMUP" --iters "$ITERS" --json "$OUT" ${EXTRA[@]+"${EXTRA[@]}"}
