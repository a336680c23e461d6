#!/usr/bin/env bash
# run_mi300x.sh: ZAYA1 pretraining on the MI300X Slurm cluster, one training process per GPU (srun).
#
#   DATA_PATH=/data/zaya/web_text_document TOKENIZER_MODEL=/data/tok/zaya.model CKPT_DIR=/ckpt/zaya1-base \
#       sbatch run_mi300x.sh                                      # 128 nodes x 8 GPUs, phase 1 of the recipe
#   bash run_mi300x.sh --dry-run                                  # print the exact command, also outside Slurm
#   bash run_mi300x.sh --check                                    # and run the trainer's checks here (login node)
#   sbatch --nodes=2 --ntasks-per-node=2 run_mi300x.sh --train-iters 20 \
#       --lr-warmup-iters 2 --lr-wsd-decay-iters 4                # any size; extra args go to the trainer
#
# Everything is set by environment variables (defaults in brackets; docs/LAUNCH.md has the full list):
#   trainer   REPO_DIR [folder of this script]  PYTHON [python3]  TRAIN_SCRIPT [$REPO_DIR/pretrain_zaya.py]
#             CONFIG [$REPO_DIR/examples/zaya1_base/phase1_4k.yaml]  PRESET []  DATA_PATH  TOKENIZER_TYPE
#             TOKENIZER_MODEL  SEQ_LENGTH  MICRO_BATCH_SIZE  GLOBAL_BATCH_SIZE  TRAIN_ITERS  LR  TP  CP  EP
#             SAVE_INTERVAL  LOG_INTERVAL  EVAL_INTERVAL  EVAL_ITERS  (empty: the value in CONFIG is used)
#             TRAIN_ARGS (replaces all of the above flags)  EXTRA_ARGS (appended)  TRAIN_ENV_SETUP (sourced per task)
#   outputs   CKPT_DIR [$REPO_DIR/checkpoints/$JOB_NAME] (--save and --load; empty: neither)
#             INIT_CKPT_DIR []: --load from here while CKPT_DIR has no checkpoint yet (the previous phase;
#             it must hold one: --exit-on-missing-checkpoint)
#             TENSORBOARD_DIR [$CKPT_DIR/tensorboard]
#             LOG_DIR [$SLURM_SUBMIT_DIR/logs]: per job $LOG_DIR/<name>-<jobid>/ holds launcher.log,
#             command.sh and attempt-<k>/rank-<r>.log
#   layout    NNODES [Slurm's; outside a job, for --dry-run/--check: 128]
#             NTASKS_PER_NODE [Slurm's, else 8]  CPUS_PER_TASK [cpus on node / tasks]  SRUN_ARGS  SRUN_MPI
#             MASTER_ADDR [first node of the allocation]  MASTER_PORT [20000 + f(job id); a free one]
#             REQUIRE_GPU [1]: a task that sees no GPU stops with an error (0: train on CPU, as the tests do)
#   RCCL/ROCm NCCL_IB_GID_INDEX [3]  NCCL_IB_HCA [RCCL's choice]  NCCL_SOCKET_IFNAME [default-route NIC]
#             HSA_NO_SCRATCH_RECLAIM [1]  GPU_MAX_HW_QUEUES [2]  HIP_FORCE_DEV_KERNARG [1]
#             TORCH_NCCL_HIGH_PRIORITY [1]  TORCH_NCCL_ASYNC_ERROR_HANDLING [1]  NCCL_CHECKS_DISABLE [1]
#             CUDA_DEVICE_MAX_CONNECTIONS [1]  NCCL_DEBUG [WARN]  OMP_NUM_THREADS [min(CPUS_PER_TASK, 8)]
#   recovery  MAX_REQUEUES [50]: SIGUSR1 before the time limit (see --signal below) is forwarded to the
#             trainer, which saves and exits; the job then requeues itself (scontrol requeue) and resumes.
#             Never with CKPT_DIR empty: there would be nothing to resume from. A job at MAX_REQUEUES with
#             training unfinished exits 3, as does a second attempt in a row without a new checkpoint; a
#             trainer failing by itself after the warning is a failure (below).
#             MAX_RESTARTS [3]: a failed run is resubmitted (sbatch --dependency=afterany) with the nodes
#             that failed added to --exclude, and resumes from the latest checkpoint. Only a trainer's own
#             exit code (1, 2, ...) or crash (139 SIGSEGV, 135 SIGBUS, 132, 136) blames its node: other
#             deaths by a signal (128+N: 143, 137, 134, ...) are srun stopping the ranks after another one
#             failed, the hang watchdog's (or a collective timeout's) 124 comes from every waiting rank, and
#             123 is a rank that lost a peer.
#             A failure on every node before any new checkpoint, or twice at the same checkpoint, is not
#             restarted. The resubmission repeats this job's partition, account, QOS, reservation,
#             constraint, GRES / GPUs per node, time limit and size, plus SBATCH_ARGS.
#             HEALTH_CHECK_CMD []: run once per node after a failure; nodes where it fails are excluded too.
#             EXCLUDE_NODES []: nodes to keep out of resubmissions from the start.  RESUBMIT_ARGS []: more sbatch flags.
#             SBATCH_ARGS []: sbatch flags of the submission (the recipe's), repeated in resubmissions.
#             END_ITER [$TRAIN_ITERS]: the iteration this run ends at; a clean exit before it requeues, and a
#             job whose latest checkpoint is already there starts no training (it only finishes).
#             ON_SUCCESS_CMD []: run (bash -c) when training has finished, e.g. submit the next phase.
#
#SBATCH --job-name=zaya1-base
#SBATCH --nodes=128
#SBATCH --ntasks-per-node=8
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out

set -uo pipefail

die() { echo "run_mi300x.sh: error: $*" >&2; exit 2; }

# --------------------------------------------------------------------------------------------
# Per-task mode: srun starts `bash run_mi300x.sh --task ATTEMPT_DIR -- CMD...` once per GPU.
# It sets the torch.distributed variables from Slurm's, logs this rank's output to
# ATTEMPT_DIR/rank-<r>.log (rank 0 also to the job output), forwards SIGUSR1/SIGTERM to the trainer
# (Slurm's SIGINT reaches it directly), and records "<node> <rank> <exit code>" in ATTEMPT_DIR/exit/rank-<r> so the
# launcher can tell which nodes failed ("<node> <rank> <exit code> <signal received or none> <time>").
# The signal field can say none although the trainer died of srun's SIGTERM (exit code 143): Slurm
# signals every process of the step, and the trainer may die before this shell's trap has run. The
# launcher therefore reads exit codes 128+N as "died of signal N", never as the node's own failure.
# --------------------------------------------------------------------------------------------
# The exit status of background process $1 in WAITED, calling $2 between polls. Not by blocking in `wait`: a
# trapped signal (the forwarded SIGUSR1, repeated every few seconds) that interrupts it just as the process
# exits loses the status, and bash then reports 138, 127 or -1 in its place. Instead: poll (a builtin read
# with a timeout, which a trap interrupts at once) until bash has reaped the process, then ask once with the
# trapped signals ($3...) ignored, so that no trap can cut in. (There is nothing left to forward them to.)
# They stay ignored: the caller sets again what it still needs.
# A trap that runs during the read must not fork (no pipe, no $(...), no subshell, no external command):
# in bash 5.2 the forked child can take the read's timeout for its own and go on running the script as a
# second copy of it, while the trap's work in the parent is lost. Such work belongs in the hook ($2).
wait_for() {
    local pid=$1 hook=$2; shift 2
    [[ -n ${IDLE_FD:-} ]] || exec {IDLE_FD}<> <(:)       # a pipe nobody writes to: read -t only times out
    while kill -0 "$pid" 2>/dev/null; do
        read -r -t 0.2 -u "$IDLE_FD" _ || :
        "$hook"
    done
    trap '' "$@"
    wait "$pid"; WAITED=$?
}

# wait_for's hook in task_main: a "pending" record as soon as srun's SIGTERM (or SIGINT) comes, replaced by
# the final one. A trainer stuck in a collective outlives Slurm's KillWait and is killed with this task, which
# then never wrote its record (see restart_after_failure for how pending records are read).
record_signal() {
    [[ $signalled == TERM || $signalled == INT ]] && [[ $signalled != "$recorded" ]] || return 0
    recorded=$signalled
    echo "$node $RANK 137 $signalled $(date +%s) pending" > "$dir/exit/rank-$RANK"
}

task_main() {
    local dir=$1; shift
    [[ ${1:-} == -- ]] && shift
    export RANK=${SLURM_PROCID:?} LOCAL_RANK=${SLURM_LOCALID:?} WORLD_SIZE=${SLURM_NTASKS:?}
    export NODE_RANK=${SLURM_NODEID:-0} LOCAL_WORLD_SIZE=${TASKS_PER_NODE_RESOLVED:-1}
    local node=${SLURMD_NODENAME:-$(hostname)} log="$dir/rank-$SLURM_PROCID.log" child rc
    # The trainer starts with SIGUSR1 ignored, so a warning that arrives before it has installed its
    # own handler cannot kill it; the launcher repeats the signal until the trainer exits. Ignored from
    # here on: one that came during TRAIN_ENV_SETUP (module loads, conda) killed this task.
    trap '' USR1
    if [[ -n ${TRAIN_ENV_SETUP:-} ]]; then
        set +u     # a setup file written for a plain shell may read unset variables (PATH=...:$LD_LIBRARY_PATH)
        # shellcheck disable=SC1090
        source "$TRAIN_ENV_SETUP" || { echo "$node $RANK 97 none $(date +%s)" > "$dir/exit/rank-$RANK"; exit 97; }
        set +e -u -o pipefail      # this script's options: a `set -e` there ended this task, unrecorded, at `wait`
    fi
    mkdir -p ${TRITON_CACHE_DIR:+"$TRITON_CACHE_DIR"} ${MIOPEN_USER_DB_PATH:+"$MIOPEN_USER_DB_PATH"} \
        ${MIOPEN_CUSTOM_CACHE_DIR:+"$MIOPEN_CUSTOM_CACHE_DIR"} 2>/dev/null || true      # on this node's disk
    local signalled=none recorded=none
    trap 'signalled=TERM; kill -s TERM $child 2>/dev/null' TERM
    # Not passed on: Slurm delivers SIGINT to the trainer too, and a second one means "stop at once"
    # (training/signals.py), which would cut its checkpoint short (a repeated SIGTERM is ignored there).
    trap 'signalled=INT' INT
    if [[ $RANK == 0 ]]; then
        # tee ignores the signals Slurm sends to the whole step, so rank 0 never writes to a dead pipe.
        "$@" > >(trap '' TERM INT USR1 HUP; exec tee -a "$log") 2>&1 &
    else
        "$@" >> "$log" 2>&1 &
    fi
    child=$!
    trap 'signalled=USR1; kill -s USR1 $child 2>/dev/null' USR1
    wait_for "$child" record_signal USR1 TERM INT; rc=$WAITED
    echo "$node $RANK $rc $signalled $(date +%s)" > "$dir/exit/rank-$RANK"
    exit "$rc"
}

if [[ ${1:-} == --task ]]; then
    shift
    task_main "$@"
fi

# --------------------------------------------------------------------------------------------
# Launcher mode.
# --------------------------------------------------------------------------------------------
DRY_RUN=0
CHECK=0
TRAINER_EXTRA=()
for a in "$@"; do
    case $a in
        --dry-run) DRY_RUN=1 ;;
        --check) DRY_RUN=1; CHECK=1 ;;      # the dry run, then pretrain_zaya.py --dry-run in this shell
        *) TRAINER_EXTRA+=("$a") ;;
    esac
done

declare -A USER_GIVEN=()
for v in MASTER_ADDR MASTER_PORT NCCL_IB_GID_INDEX NCCL_IB_HCA NCCL_SOCKET_IFNAME HSA_NO_SCRATCH_RECLAIM \
         GPU_MAX_HW_QUEUES HIP_FORCE_DEV_KERNARG TORCH_NCCL_HIGH_PRIORITY TORCH_NCCL_ASYNC_ERROR_HANDLING \
         NCCL_CHECKS_DISABLE CUDA_DEVICE_MAX_CONNECTIONS NCCL_DEBUG OMP_NUM_THREADS PYTHONUNBUFFERED \
         TRITON_CACHE_DIR MIOPEN_USER_DB_PATH MIOPEN_CUSTOM_CACHE_DIR; do
    [[ -n ${!v:-} ]] && USER_GIVEN[$v]=1
done

IN_SLURM=0
[[ -n ${SLURM_JOB_ID:-} ]] && IN_SLURM=1
if (( IN_SLURM )) && [[ -z ${SLURM_JOB_NODELIST:-} ]]; then     # a job's variables left in a login shell
    die "SLURM_JOB_ID=$SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not: this is no job's batch script (a" \
        "variable left from another job?). Submit with 'sbatch run_mi300x.sh', or unset SLURM_JOB_ID"
fi
if (( ! IN_SLURM && ! DRY_RUN )); then
    die "not inside a Slurm job. Submit with 'sbatch run_mi300x.sh', or see the command with 'bash run_mi300x.sh --dry-run'"
fi

# Where this script really lives: Slurm runs a spooled copy, so ask Slurm for the submitted path.
SCRIPT_PATH=${LAUNCHER_PATH:-}
if [[ -z $SCRIPT_PATH && $IN_SLURM == 1 && -n ${SLURM_JOB_ID:-} ]]; then
    # Not -o: there Command= runs into the next field, and a path with a space would be cut; here it has a line:
    # the path, then the script's arguments, all joined by spaces. The longest part before a space that is a file.
    SCRIPT_PATH=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *Command=//p' | head -n1)
    # (relative to where sbatch ran, not to --chdir's folder, this script's working directory)
    [[ -z $SCRIPT_PATH || $SCRIPT_PATH == /* ]] || SCRIPT_PATH=${SLURM_SUBMIT_DIR:-$PWD}/$SCRIPT_PATH
    while [[ -n $SCRIPT_PATH && ! -f $SCRIPT_PATH ]]; do
        [[ $SCRIPT_PATH == *" "* ]] && SCRIPT_PATH=${SCRIPT_PATH% *} || SCRIPT_PATH=""
    done
fi
[[ -z $SCRIPT_PATH ]] && SCRIPT_PATH=$(readlink -f "${BASH_SOURCE[0]}")
[[ $SCRIPT_PATH == /* ]] || SCRIPT_PATH="${SLURM_SUBMIT_DIR:-$PWD}/$SCRIPT_PATH"
REPO_DIR=${REPO_DIR:-$(dirname "$SCRIPT_PATH")}
SUBMIT_DIR=${SLURM_SUBMIT_DIR:-$PWD}

# What happens after the training step (finish, requeue, or restart without the failed nodes) is in
# scripts/run_mi300x_recovery.sh, next to this script in the repository (or in REPO_DIR).
RECOVERY_SH=$(dirname "$SCRIPT_PATH")/scripts/run_mi300x_recovery.sh
[[ -f $RECOVERY_SH ]] || RECOVERY_SH=$REPO_DIR/scripts/run_mi300x_recovery.sh
[[ -f $RECOVERY_SH ]] || die "cannot find scripts/run_mi300x_recovery.sh next to $SCRIPT_PATH or in" \
    "REPO_DIR=$REPO_DIR: run the launcher from a checkout of megatron-zaya, or set REPO_DIR to one"
# shellcheck source=scripts/run_mi300x_recovery.sh
source "$RECOVERY_SH"
LATEST_SH=$(dirname "$RECOVERY_SH")/checkpoint_latest.sh
[[ -f $LATEST_SH ]] || LATEST_SH=$REPO_DIR/scripts/checkpoint_latest.sh
[[ -f $LATEST_SH ]] || die "cannot find scripts/checkpoint_latest.sh next to $RECOVERY_SH or in REPO_DIR=$REPO_DIR:" \
    "the launcher needs the scripts/ of its own version of megatron-zaya"
# shellcheck source=scripts/checkpoint_latest.sh
source "$LATEST_SH"

JOB_ID=${SLURM_JOB_ID:-DRYRUN}
JOB_NAME=${SLURM_JOB_NAME:-${JOB_NAME:-zaya1-base}}
REQUEUE_COUNT=${SLURM_RESTART_COUNT:-0}
RESTART=${ZAYA_RESTART:-0}                   # resubmissions after failures so far (set by this script)

# Layout: nodes, tasks (= GPUs) per node, CPUs per task.
if (( IN_SLURM )); then
    NNODES=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
    if [[ -z ${NTASKS_PER_NODE:-} ]]; then
        if [[ -n ${SLURM_NTASKS_PER_NODE:-} ]]; then NTASKS_PER_NODE=$SLURM_NTASKS_PER_NODE
        elif [[ -n ${SLURM_NTASKS:-} ]]; then NTASKS_PER_NODE=$(( SLURM_NTASKS / NNODES ))
        else NTASKS_PER_NODE=8; fi
    fi
    NODELIST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)
    FIRST_NODE=${NODELIST%%,*}
    CPUS_ON_NODE=${SLURM_CPUS_ON_NODE:-$(nproc)}
else
    NNODES=${NNODES:-128}
    NTASKS_PER_NODE=${NTASKS_PER_NODE:-8}
    NODELIST="(allocated by Slurm)"
    FIRST_NODE='$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)'
    CPUS_ON_NODE=${CPUS_ON_NODE:-128}
fi
(( NTASKS_PER_NODE >= 1 )) || die "NTASKS_PER_NODE=$NTASKS_PER_NODE: must be >= 1"
CPUS_PER_TASK=${CPUS_PER_TASK:-$(( CPUS_ON_NODE / NTASKS_PER_NODE ))}
(( CPUS_PER_TASK >= 1 )) || CPUS_PER_TASK=1
WORLD=$(( NNODES * NTASKS_PER_NODE ))

export MASTER_ADDR=${MASTER_ADDR:-$FIRST_NODE}
if [[ -z ${MASTER_PORT:-} ]]; then
    if [[ $JOB_ID =~ ^[0-9]+$ ]]; then
        # Distinct per job, and alternating across requeues so a restart never waits on the old socket;
        # 20000..31999, below Linux's ephemeral ports (32768..), which outgoing connections may hold.
        MASTER_PORT=$(( 20000 + (JOB_ID % 6000) * 2 + REQUEUE_COUNT % 2 ))
    else
        MASTER_PORT=29500
    fi
fi
export MASTER_PORT

# RCCL / ROCm environment for MI300X nodes (each overridable; harmless on CPU-only runs).
export NCCL_IB_GID_INDEX=${NCCL_IB_GID_INDEX:-3}              # RoCE v2 GID
export HSA_NO_SCRATCH_RECLAIM=${HSA_NO_SCRATCH_RECLAIM:-1}    # keep scratch memory: no stalls in RCCL kernels
export GPU_MAX_HW_QUEUES=${GPU_MAX_HW_QUEUES:-2}
export HIP_FORCE_DEV_KERNARG=${HIP_FORCE_DEV_KERNARG:-1}
export TORCH_NCCL_HIGH_PRIORITY=${TORCH_NCCL_HIGH_PRIORITY:-1}
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}  # a hung collective aborts (restartable)
export NCCL_CHECKS_DISABLE=${NCCL_CHECKS_DISABLE:-1}
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
if [[ -z ${NCCL_SOCKET_IFNAME:-} ]] && command -v ip >/dev/null 2>&1; then
    # Bootstrap/socket traffic on the NIC of the default route (the same name on every node).
    ifname=$(ip -o -4 route show to default 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i + 1); exit}}')
    [[ -n $ifname ]] && export NCCL_SOCKET_IFNAME=$ifname
fi
[[ -n ${NCCL_IB_HCA:-} ]] && export NCCL_IB_HCA          # e.g. rdma0,rdma1,... : the 8 backend NICs
# Kernel caches on each node's own disk: in a shared home, a thousand ranks compiling the same Triton
# kernels and locking MIOpen's SQLite databases (CCA's convolutions) at once stall or fail.
NODE_CACHE_DIR=${TMPDIR:-/tmp}/megatron-zaya-${USER:-$(id -un)}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$NODE_CACHE_DIR/triton}
export MIOPEN_USER_DB_PATH=${MIOPEN_USER_DB_PATH:-$NODE_CACHE_DIR/miopen}
export MIOPEN_CUSTOM_CACHE_DIR=${MIOPEN_CUSTOM_CACHE_DIR:-$NODE_CACHE_DIR/miopen}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( CPUS_PER_TASK < 8 ? CPUS_PER_TASK : 8 ))}
export PYTHONUNBUFFERED=1
export TASKS_PER_NODE_RESOLVED=$NTASKS_PER_NODE
# A task that sees no GPU (a CUDA or CPU torch wheel, no GRES, no /dev/kfd) stops instead of training on CPU.
export MEGATRON_ZAYA_REQUIRE_GPU=${REQUIRE_GPU:-1}

# Trainer command.
PYTHON=${PYTHON:-python3}
TRAIN_SCRIPT=${TRAIN_SCRIPT:-$REPO_DIR/pretrain_zaya.py}
CKPT_DIR=${CKPT_DIR-$REPO_DIR/checkpoints/$JOB_NAME}          # set it empty to pass no --save/--load
TENSORBOARD_DIR=${TENSORBOARD_DIR-${CKPT_DIR:+$CKPT_DIR/tensorboard}}
LOG_DIR=${LOG_DIR:-$SUBMIT_DIR/logs}
JOB_LOG_DIR=$LOG_DIR/$JOB_NAME-$JOB_ID
ATTEMPT_DIR=$JOB_LOG_DIR/attempt-$REQUEUE_COUNT
CONFIG=${CONFIG-$REPO_DIR/examples/zaya1_base/phase1_4k.yaml}

ARGS=()
if [[ -n ${TRAIN_ARGS:-} ]]; then
    read -r -a ARGS <<< "$TRAIN_ARGS"
else
    [[ -n ${PRESET:-} ]] && ARGS+=(--preset "$PRESET")
    [[ -n $CONFIG ]] && ARGS+=(--config "$CONFIG")
    if [[ -n ${DATA_PATH:-} ]]; then
        read -r -a dp <<< "$DATA_PATH"      # a blend: "30 /data/a_text_document 70 /data/b_text_document"
        ARGS+=(--data-path "${dp[@]}")
    fi
    add() { [[ -n ${!1:-} ]] && ARGS+=("$2" "${!1}"); return 0; }
    add TOKENIZER_TYPE --tokenizer-type
    add TOKENIZER_MODEL --tokenizer-model
    add SEQ_LENGTH --seq-length
    add MICRO_BATCH_SIZE --micro-batch-size
    add GLOBAL_BATCH_SIZE --global-batch-size
    add TRAIN_ITERS --train-iters
    add LR --lr
    add TP --tensor-model-parallel-size
    add CP --context-parallel-size
    add EP --expert-model-parallel-size
    add SAVE_INTERVAL --save-interval
    add LOG_INTERVAL --log-interval
    add EVAL_INTERVAL --eval-interval
    add EVAL_ITERS --eval-iters
    [[ -n $TENSORBOARD_DIR ]] && ARGS+=(--tensorboard-dir "$TENSORBOARD_DIR")
fi
# The iteration the trainer's --load of CKPT_DIR continues from (checkpoint/format.py's named_latest), or
# "none" (scripts/checkpoint_latest.sh).
latest_iteration() { checkpoint_latest_iteration "$CKPT_DIR"; }

# --load: this run's own checkpoints; before the first one exists, INIT_CKPT_DIR (e.g. the previous phase),
# which must hold one: with a typo in it the phase would train from scratch (the trainer's refusal).
LOAD_DIR=$CKPT_DIR
if [[ -n ${INIT_CKPT_DIR:-} && $(latest_iteration) == none ]]; then
    LOAD_DIR=$INIT_CKPT_DIR
fi
[[ -n $CKPT_DIR ]] && ARGS+=(--save "$CKPT_DIR" --load "$LOAD_DIR")
[[ -n $CKPT_DIR && $LOAD_DIR != "$CKPT_DIR" ]] && ARGS+=(--exit-on-missing-checkpoint)
if [[ -n ${EXTRA_ARGS:-} ]]; then
    read -r -a ea <<< "$EXTRA_ARGS"
    ARGS+=("${ea[@]}")
fi
ARGS+=("${TRAINER_EXTRA[@]}")
TRAIN_CMD=("$PYTHON" "$TRAIN_SCRIPT" "${ARGS[@]}")

SRUN=(srun --nodes="$NNODES" --ntasks-per-node="$NTASKS_PER_NODE" --ntasks="$WORLD"
      --cpus-per-task="$CPUS_PER_TASK" --kill-on-bad-exit=1 --export=ALL)
[[ -n ${SRUN_MPI:-} ]] && SRUN+=(--mpi="$SRUN_MPI")
if [[ -n ${SRUN_ARGS:-} ]]; then
    read -r -a sa <<< "$SRUN_ARGS"
    SRUN+=("${sa[@]}")
fi
SRUN+=(bash "$SCRIPT_PATH" --task "$ATTEMPT_DIR" -- "${TRAIN_CMD[@]}")

EXPORTED=(MASTER_ADDR MASTER_PORT NCCL_IB_GID_INDEX NCCL_IB_HCA NCCL_SOCKET_IFNAME HSA_NO_SCRATCH_RECLAIM
          GPU_MAX_HW_QUEUES HIP_FORCE_DEV_KERNARG TORCH_NCCL_HIGH_PRIORITY TORCH_NCCL_ASYNC_ERROR_HANDLING
          NCCL_CHECKS_DISABLE CUDA_DEVICE_MAX_CONNECTIONS NCCL_DEBUG OMP_NUM_THREADS PYTHONUNBUFFERED
          TASKS_PER_NODE_RESOLVED TRITON_CACHE_DIR MIOPEN_USER_DB_PATH MIOPEN_CUSTOM_CACHE_DIR
          MEGATRON_ZAYA_REQUIRE_GPU)

print_command() {
    local v
    for v in "${EXPORTED[@]}"; do
        [[ -n ${!v:-} ]] || continue
        if [[ $v == MASTER_ADDR && $IN_SLURM == 0 && $MASTER_ADDR == "$FIRST_NODE" ]]; then
            echo "export MASTER_ADDR=$MASTER_ADDR"        # left for the job to evaluate
        else
            printf 'export %s=%q\n' "$v" "${!v}"
        fi
    done
    printf '%q ' "${SRUN[@]}"; echo
}

# Values this script derived (not given by the user) must not leak into a resubmitted job.
DERIVED=()
for v in "${EXPORTED[@]}"; do [[ -n ${!v:-} && -z ${USER_GIVEN[$v]:-} ]] && DERIVED+=("$v"); done

if (( DRY_RUN )); then
    echo "# run_mi300x.sh --dry-run: $NNODES nodes x $NTASKS_PER_NODE processes = $WORLD ranks," \
         "$CPUS_PER_TASK CPUs each; job $JOB_NAME-$JOB_ID; logs in $JOB_LOG_DIR"
    (( IN_SLURM )) || echo "# (outside Slurm: sbatch provides the node list; NNODES/NTASKS_PER_NODE set the sizes shown)"
    print_command
    if (( CHECK )); then     # every check of the job's start, as its rank 0 would make it, without GPUs
        echo "# run_mi300x.sh --check: pretrain_zaya.py --dry-run here, for WORLD_SIZE=$WORLD ($NNODES nodes x" \
             "$NTASKS_PER_NODE; outside Slurm set NNODES to your sbatch --nodes)"
        exec env WORLD_SIZE="$WORLD" "${TRAIN_CMD[@]}" --dry-run
    fi
    exit 0
fi

# --------------------------------------------------------------------------------------------
# Run the trainer (in the background, so that the signal traps fire at once).
# --------------------------------------------------------------------------------------------
mkdir -p "$ATTEMPT_DIR/exit" ${CKPT_DIR:+"$CKPT_DIR"} || die "cannot create $ATTEMPT_DIR or $CKPT_DIR"
LAUNCH_LOG=$JOB_LOG_DIR/launcher.log
log() { echo "[run_mi300x $(date '+%F %T')] $*" | tee -a "$LAUNCH_LOG"; }

# Rank 0's store listens on MASTER_PORT of this node (the batch script runs on the job's first node). Taken there
# (a job sharing the node, a service), rank 0 would fail at once and its node be blamed, or the other ranks join
# whatever listens: a derived port moves on to a free one, a given one stops the job here.
# (on loopback, and on MASTER_ADDR's address: a program may listen on either alone; rank 0 binds them all)
listening_here() {
    timeout 2 bash -c ": < /dev/tcp/127.0.0.1/$1" 2> /dev/null ||
        timeout 2 bash -c ": < /dev/tcp/$MASTER_ADDR/$1" 2> /dev/null
}
if (( IN_SLURM )) && [[ $MASTER_ADDR == "${SLURMD_NODENAME:-}" ]] && listening_here "$MASTER_PORT"; then
    [[ -z ${USER_GIVEN[MASTER_PORT]:-} ]] || die "MASTER_PORT=$MASTER_PORT is in use on $MASTER_ADDR (rank 0's" \
        "node): choose another, or leave MASTER_PORT unset for one derived from the job id"
    port=$MASTER_PORT
    for (( tries = 0; tries < 50; tries++ )); do
        port=$(( port + 2 > 31999 ? 20000 + port % 2 : port + 2 ))      # (the requeue's parity kept)
        listening_here "$port" || break
    done
    listening_here "$port" && die "ports $MASTER_PORT and the 50 after it (every other one) are in use on" \
        "$MASTER_ADDR: set a free MASTER_PORT"
    log "master port $MASTER_PORT is in use on $MASTER_ADDR: using $port"
    export MASTER_PORT=$port
fi
{ echo "#!/usr/bin/env bash"; echo "# job $JOB_ID attempt $REQUEUE_COUNT restart $RESTART on $NODELIST"; print_command; } \
    > "$JOB_LOG_DIR/command.sh"

log "job $JOB_ID ($JOB_NAME) attempt $REQUEUE_COUNT (requeues $REQUEUE_COUNT/${MAX_REQUEUES:-50}," \
    "failure restarts $RESTART/${MAX_RESTARTS:-3}) on $NNODES nodes [$NODELIST] x $NTASKS_PER_NODE tasks"
log "master $MASTER_ADDR:$MASTER_PORT; checkpoints $CKPT_DIR (latest: $(latest_iteration)); logs $JOB_LOG_DIR"
[[ $LOAD_DIR != "$CKPT_DIR" ]] && log "no checkpoint in $CKPT_DIR yet: starting from INIT_CKPT_DIR=$INIT_CKPT_DIR"
log "command: $(printf '%q ' "${SRUN[@]}")"

END_ITER=${END_ITER:-${TRAIN_ITERS:-}}
RC=0
if training_done; then
    # Do not start the trainer: its --exit-interval check runs after a step (as in Megatron-LM), so a
    # trainer resumed at its end iteration would train on past it (into the next phase's range).
    log "the latest checkpoint (iteration $(latest_iteration)) is already at END_ITER=$END_ITER: nothing to" \
        "train, not starting srun"
    finish
fi

# >>> signal forwarding and srun's start (cut out by tests/slurm/test_run_mi300x_wait.py)
# The traps only count; pass_on_signals, wait_for's hook, forwards between polls (see wait_for). The
# recovery reads RECEIVED[TERM] as it is when it decides: also a SIGTERM that came after srun ended (Slurm
# signals the step first, then this shell), which nothing passed on.
SAW_USR1=0
SRUN_PID=""
USR1_REPEAT=${USR1_REPEAT_SECONDS:-20}
declare -A RECEIVED=([USR1]=0 [TERM]=0) PASSED_ON=([USR1]=0 [TERM]=0)
pass_on_signals() {
    local sig
    for sig in TERM USR1; do
        (( RECEIVED[$sig] > PASSED_ON[$sig] )) || continue
        PASSED_ON[$sig]=${RECEIVED[$sig]}
        forward_signal "$sig"
    done
}
forward_signal() {
    kill -0 "$SRUN_PID" 2>/dev/null || return 0
    if [[ $1 == USR1 ]]; then
        (( SAW_USR1 )) || log "received SIGUSR1 (time limit near): forwarding it to the training processes" \
                              "(they save a checkpoint and exit); repeated every ${USR1_REPEAT}s until they do"
        SAW_USR1=1
        ( sleep "$USR1_REPEAT"; kill -s USR1 $$ 2>/dev/null ) &
    else
        log "received SIG$1: forwarding it to the training processes (they save a checkpoint and exit)"
    fi
    kill -s "$1" "$SRUN_PID" 2>/dev/null
}
trap '(( ++RECEIVED[USR1] ))' USR1
trap '(( ++RECEIVED[TERM] ))' TERM

START=$(date +%s)
LATEST_AT_START=$(latest_iteration)
"${SRUN[@]}" &
SRUN_PID=$!
if (( RECEIVED[USR1] )); then       # came as srun started, which has no handler yet: the repeat passes it on
    PASSED_ON[USR1]=${RECEIVED[USR1]} SAW_USR1=1
    log "received SIGUSR1 (time limit near) as srun started: passing it on in ${USR1_REPEAT}s, then every" \
        "${USR1_REPEAT}s"
    ( sleep "$USR1_REPEAT"; kill -s USR1 $$ 2>/dev/null ) &
fi
# <<< signal forwarding
wait_for "$SRUN_PID" pass_on_signals USR1 TERM; RC=$WAITED
trap '(( ++RECEIVED[TERM] ))' TERM     # (nothing to do now; the health check and sbatch start without it ignored)
log "training step ended with exit code $RC after $(( $(date +%s) - START )) s; latest checkpoint: $(latest_iteration)"

after_training_step     # finishes, requeues or resubmits; never returns
