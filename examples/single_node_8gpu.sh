#!/usr/bin/env bash
# examples/single_node_8gpu.sh: train on one 8-GPU node with torchrun (no Slurm needed).
#
#   DATA_PATH=/data/zaya/web_text_document TOKENIZER_MODEL=/data/tokenizers/gemma3 \
#       bash examples/single_node_8gpu.sh                          # config: examples/single_node_8gpu.yaml
#   bash examples/single_node_8gpu.sh --preset zaya1-base-4l --train-iters 50 \
#       --lr-warmup-iters 5 --lr-wsd-decay-iters 10            # extra flags go to the trainer (they win)
#   DRY_RUN=1 DATA_PATH=... TOKENIZER_MODEL=... bash examples/single_node_8gpu.sh   # print the command only
#
# Environment: DATA_PATH (a prefix or a blend "w1 p1 w2 p2"), TOKENIZER_MODEL, TOKENIZER_TYPE (the config's
# HuggingFaceTokenizer unless set: GPTSentencePieceTokenizer for a SentencePiece .model), NPROC (8), OUT
# (runs/single_node_8gpu: checkpoints in $OUT/ckpt, TensorBoard in $OUT/tb), CONFIG, PYTHON.
# On a Slurm cluster the same run is `sbatch --nodes=1 run_mi300x.sh` with
# CONFIG=examples/single_node_8gpu.yaml (adds requeue at the time limit and restarts).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

: "${DATA_PATH:?set DATA_PATH to the preprocessed data prefix (or a blend)}"
sp_note="a SentencePiece .model with TOKENIZER_TYPE=GPTSentencePieceTokenizer"
: "${TOKENIZER_MODEL:?set TOKENIZER_MODEL to the tokenizer (a tokenizer.json folder; $sp_note)}"
NPROC=${NPROC:-8}
OUT=${OUT:-$REPO/runs/single_node_8gpu}
CONFIG=${CONFIG:-$REPO/examples/single_node_8gpu.yaml}
PYTHON=${PYTHON:-python3}

# ROCm / RCCL settings for MI300X (ignored on NVIDIA); see docs/LAUNCH.md.
export HSA_NO_SCRATCH_RECLAIM=${HSA_NO_SCRATCH_RECLAIM:-1}
export GPU_MAX_HW_QUEUES=${GPU_MAX_HW_QUEUES:-2}
export HIP_FORCE_DEV_KERNARG=${HIP_FORCE_DEV_KERNARG:-1}
export TORCH_NCCL_HIGH_PRIORITY=${TORCH_NCCL_HIGH_PRIORITY:-1}
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

read -r -a data <<< "$DATA_PATH"
tokenizer=(--tokenizer-model "$TOKENIZER_MODEL")
[[ -n ${TOKENIZER_TYPE:-} ]] && tokenizer+=(--tokenizer-type "$TOKENIZER_TYPE")
CMD=("$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$NPROC"
     "$REPO/pretrain_zaya.py" --config "$CONFIG" --data-path "${data[@]}" "${tokenizer[@]}"
     --save "$OUT/ckpt" --load "$OUT/ckpt" --tensorboard-dir "$OUT/tb" "$@")
if [[ ${DRY_RUN:-0} == 1 ]]; then
    printf '%q ' "${CMD[@]}"; echo
    exit 0
fi
mkdir -p "$OUT"
exec "${CMD[@]}"
