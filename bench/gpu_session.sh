#!/usr/bin/env bash
# Every GPU check of this repository in one run, sized for a 15-minute GPU lease: the device, the SDPA
# kernel the attention gets, the kernel benchmark (issue 7), training throughput and MFU of
# zaya1-base-4l (issue 9), the whole model with Triton kernels against the PyTorch reference (fp32 and
# bf16), a stopped and resumed run, then two more throughput layouts. Most needed first, each step under its
# own time limit cut to what is left of BUDGET seconds (default 520: one device command may run 600 s,
# and the machine's start counts against the lease too); a step that no longer fits is skipped and
# says so. Logs and JSON go to $OUT (default bench_gpu_session/), with one line per step and its exit
# code (or "skipped") in $OUT/summary.txt. A failing step does not stop the others.
#
#   bash bench/gpu_session.sh
#   OUT=/tmp/out SEQ=4096 BUDGET=520 bash bench/gpu_session.sh
#
# Runs from the repository root without installing (the bench scripts put the root on sys.path).
# It needs torch with a visible GPU, plus triton, numpy, safetensors and pyyaml.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench_gpu_session}
SEQ=${SEQ:-4096}
mkdir -p "$OUT"
: > "$OUT/summary.txt"
export PYTHONUNBUFFERED=1

BUDGET=${BUDGET:-520}
MIN_STEP=${MIN_STEP:-20}     # a step with less time than this left is skipped

GROUP_FILE=$(mktemp) TEE_FILE=$(mktemp)
trap 'rm -f "$GROUP_FILE" "$TEE_FILE"' EXIT

# step NAME SECONDS COMMAND...: run it under min(SECONDS, what is left of BUDGET), log it, record its exit code.
# timeout runs the step in its own process group and signals the group; whatever of it is left when the step
# ends is killed then (a trainer that finishes its iteration on SIGTERM, orphaned by a bench script that
# died of it, must not run on beside the next step).
step() {
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET - SECONDS))
    if (( left < MIN_STEP )); then
        echo "$name: skipped (${left} s of the ${BUDGET} s budget left)" | tee -a "$OUT/summary.txt"
        return
    fi
    (( limit > left )) && limit=$left
    echo "== $name (limit ${limit} s)"
    local start=$SECONDS
    # timeout's pid (noted before the exec) is its process group's id. The log's tee is a process substitution,
    # not a pipe: a leftover writing to it would hold a pipeline open, and the kill below waits for the step only.
    bash -c 'echo $$ > "$0"; exec timeout -k 5 "$@"' "$GROUP_FILE" "$limit" "$@" \
        > >(echo "$BASHPID" > "$TEE_FILE"; exec tee "$OUT/$name.log") 2>&1
    local rc=$? waited=0
    kill -KILL -- "-$(cat "$GROUP_FILE")" 2> /dev/null
    # The step's last lines out before its summary line: until tee has exited (a zombie until bash reaps it), at
    # most 5 s (a leftover outside the group keeps tee open).
    while [[ $(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$(cat "$TEE_FILE")/status" 2> /dev/null) == [^Z] ]] \
            && (( waited++ < 50 )); do
        sleep 0.1
    done
    echo "$name: rc=$rc ($((SECONDS - start)) s)" | tee -a "$OUT/summary.txt"
}

"${PYTHON:-python3}" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no GPU visible to torch')" || exit 1
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>/dev/null || rocm-smi 2>/dev/null
  "${PYTHON:-python3}" -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__, '|', torch.cuda.get_device_name())"
  date -u +"%Y-%m-%d %H:%M UTC"; } | tee "$OUT/device.txt"

step sdpa_backends 30 "${PYTHON:-python3}" bench/sdpa_backends.py --seq-length "$SEQ"
step kernels 130 "${PYTHON:-python3}" bench/kernels.py --reps 50 --json "$OUT/kernels.json"
# Global batch 16 sequences: the optimizer step (Muon) is amortised over 8 (then 4) micro-batches, as
# in real runs (ZAYA1: thousands of sequences per step); global = micro made Muon half of each step.
step train_mbs2_gbs16 90 env SEQ="$SEQ" MICRO=2 GLOBAL=16 WARMUP=1 ITERS=3 OUT="$OUT/train_mbs2_gbs16.json" \
    bash bench/gpu_train_throughput.sh
step model_check 130 "${PYTHON:-python3}" bench/gpu_model_check.py --seq-length 2048 --dtype both
# A run stopped and resumed on the GPU: the restart's model built on the meta device, allocated on the GPU
# (after the kernel benchmark, so that Triton's cache holds the kernels its three processes compile).
step resume_check 90 "${PYTHON:-python3}" bench/gpu_resume_check.py --out "$OUT/resume_check"
# Packed documents of 512 tokens: the attention bias, K/V repeated for the memory-efficient kernel
# (cca.kv_for_sdpa) and the segmented convolutions, against train_mbs2_gbs16.
step train_packed_mbs2_gbs16 90 env SEQ="$SEQ" MICRO=2 GLOBAL=16 WARMUP=1 ITERS=3 DOCUMENT_LENGTH=512 \
    OUT="$OUT/train_packed_mbs2_gbs16.json" bash bench/gpu_train_throughput.sh
step train_mbs4_gbs16 90 env SEQ="$SEQ" MICRO=4 GLOBAL=16 WARMUP=1 ITERS=3 OUT="$OUT/train_mbs4_gbs16.json" \
    bash bench/gpu_train_throughput.sh
echo "== summary"
cat "$OUT/summary.txt"
! grep -qv "rc=0 " "$OUT/summary.txt"
