#!/usr/bin/env bash
# examples/zaya1_base/run_zaya1_base.sh: the ZAYA1-base three-phase recipe on the MI300X cluster.
#
#   DATA_ROOT=/data/zaya TOKENIZER_MODEL=/data/tokenizers/gemma3 CKPT_ROOT=/ckpt/zaya1-base \
#       bash examples/zaya1_base/run_zaya1_base.sh all       # first phase not complete now; the rest follow
#   bash examples/zaya1_base/run_zaya1_base.sh phase2         # one phase (the previous one complete, this one not)
#   bash examples/zaya1_base/run_zaya1_base.sh all --dry-run  # show the sbatch and srun commands only (and
#                                                            # what a real run would refuse)
#
# Phases (configs next to this script; the step arithmetic is in phase1_4k.yaml):
#   phase1  4K context, web-heavy blend, ends at iteration 476,837               phase1_4k.yaml
#   phase2  4K context, math/code/reasoning-heavy blend, ends at 715,256         phase2_4k_mix.yaml
#   phase3  32K context, RoPE base 1M, CP=2, long-context + reasoning, 834,465   phase3_32k.yaml
# Each phase is one run_mi300x.sh job (128 nodes x 8 GPUs by default) that requeues itself at its time
# limit and restarts after failures (see docs/LAUNCH.md). Phase N+1 starts from phase N's last
# checkpoint (INIT_CKPT_DIR) and saves into its own folder $CKPT_ROOT/phase<N+1>. With `all`, the job
# that completes a phase submits the next one (run_mi300x.sh's ON_SUCCESS_CMD).
#
# Environment: DATA_ROOT (folder of the preprocessed *_text_document files), PHASE1_DATA,
# PHASE2_DATA, PHASE3_DATA (the blends: "weight prefix weight prefix ..."; defaults below are
# illustrative), TOKENIZER_MODEL, CKPT_ROOT, SBATCH_ARGS (e.g. "--account=proj --partition=mi300x"),
# and anything run_mi300x.sh reads (NCCL_IB_HCA, MAX_RESTARTS, ...).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
SELF=$HERE/$(basename "${BASH_SOURCE[0]}")

usage() { sed -n '2,8p' "$SELF" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 1 ]] || usage
WHAT=$1; shift
DRY=0; CHAIN=0
for a in "$@"; do
    case $a in
        --dry-run) DRY=1 ;;
        --chain) CHAIN=1 ;;
        *) echo "run_zaya1_base.sh: unknown option $a" >&2; usage ;;
    esac
done
case $WHAT in
    all) PHASE=1; CHAIN=1 ;;
    phase1|phase2|phase3) PHASE=${WHAT#phase} ;;
    *) usage ;;
esac

DATA_ROOT=${DATA_ROOT:-/data/zaya}
CKPT_ROOT=${CKPT_ROOT:-$REPO/checkpoints/zaya1-base}
: "${TOKENIZER_MODEL:=$DATA_ROOT/tokenizer}"
D=$DATA_ROOT
PHASE1_DATA=${PHASE1_DATA:-"70 $D/web_text_document 12 $D/code_text_document 8 $D/math_text_document 5 $D/books_text_document 5 $D/reasoning_text_document"}
PHASE2_DATA=${PHASE2_DATA:-"30 $D/web_text_document 25 $D/code_text_document 25 $D/math_text_document 20 $D/reasoning_text_document"}
PHASE3_DATA=${PHASE3_DATA:-"40 $D/long_context_text_document 30 $D/reasoning_text_document 15 $D/code_text_document 15 $D/math_text_document"}

CONFIGS=("" phase1_4k.yaml phase2_4k_mix.yaml phase3_32k.yaml)
END_ITERS=("" 476837 715256 834465)
DATAS=("" "$PHASE1_DATA" "$PHASE2_DATA" "$PHASE3_DATA")

# A phase's latest complete checkpoint, as the launcher and the trainer count it (0: none yet)
# shellcheck source=../../scripts/checkpoint_latest.sh
source "$REPO/scripts/checkpoint_latest.sh"
latest() {
    local it
    it=$(checkpoint_latest_iteration "$1")
    if [[ $it == none ]]; then echo 0; else echo "$it"; fi
}

# A refusal: without --dry-run the script stops (exit 1); a dry run picks the phase the real run would
# and says what it would refuse, then shows the commands anyway (a preview before the checkpoints exist).
refuse() {
    echo "run_zaya1_base.sh: $*" >&2
    (( DRY )) || exit 1
    echo "# note: without --dry-run this is refused: $*"
}

# A phase whose checkpoint has reached its end is not run again: the trainer checks --exit-interval
# after each step (as Megatron-LM does), so a run resumed exactly at its end would train past it.
# With `all` / --chain the next phase that is not complete is submitted instead (a broken chain is
# restarted by running `all` again); a single phase asked for by name is refused.
while true; do
    have=$(latest "$CKPT_ROOT/phase$PHASE")
    [[ $have =~ ^[0-9]+$ ]] && (( have >= END_ITERS[PHASE] )) || break
    if (( CHAIN && PHASE < 3 )); then
        echo "run_zaya1_base.sh: phase $PHASE is already complete ($CKPT_ROOT/phase$PHASE is at iteration" \
             "$have, it ends at ${END_ITERS[PHASE]}): going on with phase $(( PHASE + 1 ))" >&2
        PHASE=$(( PHASE + 1 ))
    elif (( CHAIN )); then
        echo "run_zaya1_base.sh: every phase is complete ($CKPT_ROOT/phase3 is at iteration $have): nothing to submit" >&2
        exit 0
    else
        refuse "phase $PHASE is already complete: $CKPT_ROOT/phase$PHASE is at iteration $have, it ends at" \
               "${END_ITERS[PHASE]}; not submitting it again (a resumed run would train past its end)"
        break
    fi
done

if (( PHASE > 1 )); then
    prev=$CKPT_ROOT/phase$(( PHASE - 1 ))
    have=$(latest "$prev")
    if ! [[ $have =~ ^[0-9]+$ ]] || (( have < END_ITERS[PHASE - 1] )); then
        refuse "phase $(( PHASE - 1 )) is not complete: $prev is at iteration $have, it ends at" \
               "${END_ITERS[PHASE - 1]}"
    fi
fi

export CONFIG=$HERE/${CONFIGS[PHASE]}
export DATA_PATH=${DATAS[PHASE]}
export TOKENIZER_MODEL
export CKPT_DIR=$CKPT_ROOT/phase$PHASE
export END_ITER=${END_ITERS[PHASE]}
if (( PHASE > 1 )); then export INIT_CKPT_DIR=$CKPT_ROOT/phase$(( PHASE - 1 )); else unset INIT_CKPT_DIR; fi
if (( CHAIN && PHASE < 3 )); then
    export ON_SUCCESS_CMD="bash $(printf %q "$SELF") phase$(( PHASE + 1 )) --chain"
else
    unset ON_SUCCESS_CMD
fi

SUB=(sbatch --job-name="zaya1-base-p$PHASE" --chdir="$REPO")
[[ -n ${ZAYA_EXCLUDE:-} ]] && SUB+=(--exclude="$ZAYA_EXCLUDE")     # nodes an earlier phase found bad
if [[ -n ${SBATCH_ARGS:-} ]]; then
    read -r -a extra <<< "$SBATCH_ARGS"
    SUB+=("${extra[@]}")
fi
SUB+=("$REPO/run_mi300x.sh")

if (( DRY )); then
    echo "# phase $PHASE: $(basename "$CONFIG"), checkpoints $CKPT_DIR${INIT_CKPT_DIR:+ (starting from $INIT_CKPT_DIR)}"
    for v in CONFIG DATA_PATH TOKENIZER_MODEL CKPT_DIR INIT_CKPT_DIR END_ITER ON_SUCCESS_CMD; do
        [[ -n ${!v:-} ]] && printf 'export %s=%q\n' "$v" "${!v}"
    done
    printf '%q ' "${SUB[@]}"; echo
    echo "# run_mi300x.sh will run:"
    (unset SLURM_JOB_ID; JOB_NAME="zaya1-base-p$PHASE" bash "$REPO/run_mi300x.sh" --dry-run | sed -n '/^srun /p')
    exit 0
fi
mkdir -p "$CKPT_DIR"
echo "phase $PHASE: $(printf '%q ' "${SUB[@]}")"
"${SUB[@]}"
