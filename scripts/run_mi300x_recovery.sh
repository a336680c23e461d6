#!/usr/bin/env bash
# run_mi300x_recovery.sh: what run_mi300x.sh does once its training step has ended (sourced by it, not run):
# finish, requeue at the time limit, or find the failed nodes and resubmit the job without them.
# It reads run_mi300x.sh's settings (CKPT_DIR, END_ITER, RC, RECEIVED, SAW_USR1, LATEST_AT_START,
# ATTEMPT_DIR, the layout and the job's identity) and its log / latest_iteration / die functions.
# The variables and their defaults are documented at the top of run_mi300x.sh and in docs/LAUNCH.md.

# Slurm's own variables of this job and its steps: a fresh submission (resubmission, ON_SUCCESS_CMD)
# must not inherit them (sbatch passes the environment on, and a stale SLURM_RESTART_COUNT,
# SLURM_CPUS_PER_TASK, SLURM_NTASKS, ... would change the next job). The user's own settings stay:
# SBATCH_* (SBATCH_ARGS, SBATCH_PARTITION, ...), SRUN_ARGS/SRUN_MPI and the other SRUN_*, SLURM_CONF and
# any SLURM_* input variable not named here (SLURM_MPI_TYPE, SLURM_HINT, ...).
SLURM_JOB_VARS='^(SLURM_(JOB_.*|JOBID|STEP_.*|STEPID|PROCID|LOCALID|NODEID|NTASKS.*|NPROCS|NNODES|NODELIST|TASKS_PER_NODE|TASK_PID|CPUS_.*|MEM_PER_.*|GPUS.*|GPU_.*|TRES_PER_TASK|RESTART_COUNT|SUBMIT_.*|CLUSTER_NAME|ARRAY_.*|HET_.*|PACK_.*|TOPOLOGY_ADDR.*|GTIDS|PRIO_PROCESS|EXPORT_ENV|SCRIPT_CONTEXT|SHARDS_ON_NODE|OVERCOMMIT|DISTRIBUTION|THREADS_PER_CORE|OPEN_MODE|NODE_ALIASES|WORKING_CLUSTER|SPANK_.*|CPU_BIND.*|MEM_BIND.*|LAUNCH_NODE_IPADDR|SRUN_COMM_.*|UMASK)|SLURMD_.*|SRUN_CPUS_PER_TASK)$'

# Run a command in the environment of a fresh submission: without Slurm's variables of this job
# (above) and without the values this script derived for this allocation.
run_clean() {
    local clean=() v
    for v in "${DERIVED[@]}"; do clean+=(-u "$v"); done
    while read -r v; do
        clean+=(-u "$v")
    done < <(compgen -e | grep -E "$SLURM_JOB_VARS")
    env "${clean[@]}" "$@"
}

finish() {
    log "training finished (latest checkpoint: $(latest_iteration))"
    if [[ -n ${ON_SUCCESS_CMD:-} ]]; then
        log "running ON_SUCCESS_CMD: $ON_SUCCESS_CMD"
        run_clean ZAYA_RESTART=0 bash -c "$ON_SUCCESS_CMD" 2>&1 | tee -a "$LAUNCH_LOG"
    fi
    exit 0
}

requeue() {
    if [[ -z $CKPT_DIR ]]; then
        log "not requeueing: CKPT_DIR is empty (no --save/--load), so a requeued job would start over from" \
            "iteration 0 instead of resuming"
        exit "$RC"
    fi
    if (( REQUEUE_COUNT >= ${MAX_REQUEUES:-50} )); then
        # Not a success: Slurm's state (and an afterok dependency) must not take an unfinished run for one.
        log "not requeueing: MAX_REQUEUES=${MAX_REQUEUES:-50} reached; training is not finished (latest" \
            "checkpoint: $(latest_iteration))"
        exit 3
    fi
    # Two attempts in a row without a new checkpoint would go on so, MAX_REQUEUES times over: the time-limit
    # warning came before the trainer could save (a limit shorter than its start-up plus the warning's lead),
    # or its save never ended before the limit. One such attempt is requeued (a slow start-up once, a save
    # that failed once); the file names the checkpoint it ended at.
    local stalled=$JOB_LOG_DIR/requeued-without-a-new-checkpoint
    if [[ $(latest_iteration) != "$LATEST_AT_START" ]]; then
        rm -f "$stalled"
    elif [[ -f $stalled && $(< "$stalled") == "$LATEST_AT_START" ]]; then
        log "not requeueing: this attempt and the one before ended without a new checkpoint (latest:" \
            "$LATEST_AT_START), so the next would too. Give the job a longer --time, or make its start-up and a" \
            "save fit in the warning's lead (--signal=B:USR1@<seconds>)"
        exit 3
    else
        echo "$LATEST_AT_START" > "$stalled"
    fi
    log "requeueing job $JOB_ID (requeue $(( REQUEUE_COUNT + 1 ))/${MAX_REQUEUES:-50}) to resume from iteration $(latest_iteration)"
    trap 'exit 0' TERM          # the requeue itself ends this attempt with SIGTERM
    scontrol requeue "$JOB_ID" || { log "error: scontrol requeue $JOB_ID failed"; exit 1; }
    sleep 60   # Slurm ends this attempt now; do not exit first and let the job complete
    exit 0
}

training_done() {          # 2: unknown (no END_ITER, or no CKPT_DIR to read the iteration from)
    [[ -n $END_ITER && -n $CKPT_DIR ]] || return 2
    local it; it=$(latest_iteration)
    [[ $it =~ ^[0-9]+$ ]] && (( it >= END_ITER ))
}

# Seconds in Slurm's [D-][HH:]MM:SS; nothing for UNLIMITED or anything else.
slurm_seconds() {
    local d=0 t=$1 h=0 m s
    [[ $t == *-* ]] && { d=${t%%-*}; t=${t#*-}; }
    [[ $t =~ ^([0-9]+:)?([0-9]+):([0-9]+)$ ]] || return 0
    h=${BASH_REMATCH[1]%:}; m=${BASH_REMATCH[2]}; s=${BASH_REMATCH[3]}
    echo $(( 10#$d * 86400 + 10#${h:-0} * 3600 + 10#$m * 60 + 10#$s ))
}

# Whether a SIGTERM was the time limit's: Slurm's RunTime against TimeLimit (its state says COMPLETING
# after a cancellation, a preemption and the limit alike; the run time stops at a cancellation). "limit" when
# RunTime is within 10 s of TimeLimit or past it, "before" when it is short of it, "unknown" (no limit, or
# scontrol could not say).
time_limit_reached() {
    local info run limit
    info=$(scontrol show job -o "$JOB_ID" 2>/dev/null | head -n1)
    run=$(slurm_seconds "$(grep -o 'RunTime=[^ ]*' <<< "$info" | cut -d= -f2)")
    limit=$(slurm_seconds "$(grep -o 'TimeLimit=[^ ]*' <<< "$info" | cut -d= -f2)")
    if [[ -z $run || -z $limit ]]; then echo unknown
    elif (( run < limit - 10 )); then echo before
    else echo limit; fi
}

# The time limit's SIGTERM, without a warning first or after a failure: requeued to resume, if this attempt
# wrote a checkpoint (otherwise each attempt would end the same way, MAX_REQUEUES times over).
requeue_at_time_limit() {
    training_done && finish
    if [[ $(latest_iteration) == "$LATEST_AT_START" ]]; then
        log "stopped by the time limit's SIGTERM without a new checkpoint in this attempt (latest:" \
            "$(latest_iteration)): not requeueing. A save must end before the limit and Slurm's KillWait:" \
            "a shorter --save-interval, or --signal=B:USR1@<seconds> for a warning"
        (( RC )) && exit "$RC"
        exit 3
    fi
    log "stopped by the time limit's SIGTERM (RunTime at TimeLimit): resuming from the latest complete checkpoint"
    requeue
}

# In the failure analysis, a SIGTERM that came after the step ended (Slurm signals the step first): the time
# limit's is a requeue when no rank failed by itself (with one that did, the resubmission goes on); any other
# means cancelled or preempted.
stop_for_late_sigterm() {
    (( RECEIVED[TERM] )) || return 0
    if [[ $(time_limit_reached) == limit ]]; then
        (( ${#OWN[@]} )) || requeue_at_time_limit
        return 0
    fi
    log "SIGTERM came while the failure was analysed (cancelled or preempted); not resubmitting"
    exit "$RC"
}

# The decision after the step: the time-limit warning, a cancellation, a clean exit, or a failure.
after_training_step() {
    if (( SAW_USR1 )); then       # the time-limit warning came (even if Slurm's SIGTERM followed): requeue
        training_done && finish
        if (( RECEIVED[TERM] )) && [[ $(time_limit_reached) == before ]]; then
            log "stopped by SIGTERM after the time-limit warning but before the limit (cancelled or preempted);" \
                "not requeueing"
            exit "$RC"
        fi
        # Unless the trainer failed by itself: an error exit with no new checkpoint and no SIGTERM from Slurm
        # (a short job gets the warning within seconds) goes to the failure analysis below, whose bounds hold.
        # (138: srun itself died of the SIGUSR1 passed on, before it had its handler: the warning's doing)
        if (( RC == 0 || RC == 138 || RECEIVED[TERM] )) || [[ $(latest_iteration) != "$LATEST_AT_START" ]]; then
            (( RC == 0 )) || log "warning: the trainer exited $RC after SIGUSR1; resuming from the latest complete" \
                                 "checkpoint"
            requeue
        fi
        log "the trainer exited $RC after SIGUSR1 without a new checkpoint or a SIGTERM: a failure, not the time limit"
    fi
    if (( RECEIVED[TERM] )); then
        [[ $(time_limit_reached) == limit ]] && requeue_at_time_limit     # no warning came (no --signal)
        log "stopped by SIGTERM (cancelled, preempted or a node failed; Slurm itself requeues a job whose node" \
            "failed); not restarting"
        exit "$RC"
    fi
    if (( RC == 0 )); then
        training_done
        case $? in
            0) finish ;;
            2) [[ -n $END_ITER ]] && log "CKPT_DIR is empty, so END_ITER=$END_ITER cannot be checked: taking the" \
                                          "clean exit as the end of training (nothing to resume from)"
               finish ;;
            *) log "the trainer exited cleanly before END_ITER=$END_ITER (e.g. --exit-duration-in-mins)"; requeue ;;
        esac
    fi
    restart_after_failure
}

# Failure: find the nodes to blame, then resubmit without them (a bounded number of times).
restart_after_failure() {
    local node rank rc sig state f n t ok HC_RC TERMS_BEFORE PENDING_NOTE EXCLUDE BAD_LIST JOB_INFO LIMIT
    local MAIL_TYPE NEW FROM SUBMITTED SUBMIT_ERR SAID
    local -A BAD=() SEEN=() PENDING_NODES=()
    local OWN=() STOPPED=() HUNG=() PEER_LOST=() PENDING=() HC_BAD=() NODES=() SUB=() CARRIED=() GRES=() tres=()
    local sba=() ra=()
    if training_done; then
        log "warning: exit code $RC, but the last checkpoint is iteration $(latest_iteration) = END_ITER: the run" \
            "is complete (a rank failed while shutting down; see $ATTEMPT_DIR/exit/)"
        finish
    fi
    # Each rank's record: "<node> <rank> <exit code> <signal received or none> <time> [pending]". Only the trainer's
    # own failures blame its node: its exit codes (1, 2, 97, ...: an exception, a bad flag,
    # TRAIN_ENV_SETUP), and the faults of its own execution, which no peer or srun sends: 139 (SIGSEGV),
    # 135 (SIGBUS: often a memory error), 132 (SIGILL), 136 (SIGFPE), when the task received no signal.
    # Not:
    #  - a signal received by the task, or an exit code 128+N (died of signal N: 143 TERM, 137 KILL,
    #    130 INT, 134 ABRT, ...) or none that makes sense: srun stops every rank once one has failed, and
    #    a trainer can die of the signal before its task wrapper records it; a peer's failure also makes
    #    RCCL/NCCL abort the healthy ranks;
    #  - 124, the trainer's hang watchdog (megatron_zaya/training/watchdog.py), or a collective that timed out
    #    (--distributed-timeout-minutes): every rank waiting in a hung collective gives it, the healthy ones
    #    included. HEALTH_CHECK_CMD is the tool that finds a bad node;
    #  - 123, a trainer whose collective failed because another rank is gone (gloo raises at once when a peer's
    #    socket closes, often before srun's SIGTERM arrives; megatron_zaya/parallel/collective_failures.py).
    # A record still "pending" (its task got srun's SIGTERM, and its trainer did not exit before Slurm's KillWait
    # ran out) counts as stopped by a signal when every node has one (ranks stuck in collectives after one
    # failed) or when some rank left no record at all (a lost node: the others were stuck waiting for it), and
    # as missing otherwise: only that node's trainers did not stop.
    local SELF_FAULTS="132 135 136 139"
    for f in "$ATTEMPT_DIR"/exit/rank-*; do
        [[ -f $f ]] || continue
        read -r node rank rc sig _ state < "$f" || continue
        if [[ $state == pending ]]; then
            PENDING+=("$rank") PENDING_NODES[$node]=1
            continue
        fi
        SEEN[$rank]=1
        if [[ $rc == 0 ]]; then
            continue
        elif [[ $rc == 124 ]]; then
            HUNG+=("$rank")
        elif [[ $rc == 123 ]]; then
            PEER_LOST+=("$rank")
        elif [[ $sig != none || ! $rc =~ ^[0-9]+$ ]] ||
             { (( rc >= 128 )) && [[ " $SELF_FAULTS " != *" $rc "* ]]; }; then
            STOPPED+=("$rank")
        else
            OWN+=("$rank@$node:$rc")
            BAD[$node]=1
        fi
    done
    PENDING_NOTE=""
    if (( ${#PENDING[@]} )); then
        PENDING_NOTE=" (${#PENDING[@]} killed while stopping, on ${#PENDING_NODES[@]} of $NNODES nodes: counted as"
        if (( ${#PENDING_NODES[@]} >= NNODES || ${#SEEN[@]} + ${#PENDING[@]} < WORLD )); then
            for rank in "${PENDING[@]}"; do SEEN[$rank]=1; STOPPED+=("$rank"); done
            PENDING_NOTE+=" stopped)"
        else
            PENDING_NOTE+=" missing)"
        fi
    fi
    log "exit records: ${#OWN[@]} rank(s) failed by themselves${OWN:+ (${OWN[*]})}, ${#STOPPED[@]} stopped by a" \
        "signal, ${#HUNG[@]} stopped by the hang watchdog (124), ${#PEER_LOST[@]} stopped by a lost peer (123)," \
        "$(( WORLD - ${#SEEN[@]} )) missing$PENDING_NOTE"
    stop_for_late_sigterm      # (again before the resubmission: one can come during the health check)
    if (( ${#BAD[@]} == 0 )); then
        # No rank reported its own failure: blame the nodes whose ranks never reported (lost nodes).
        mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
        for (( r = 0; r < WORLD; r++ )); do
            [[ -n ${SEEN[$r]:-} ]] || BAD[${NODES[r / NTASKS_PER_NODE]}]=1
        done
    fi
    if (( RESTART > 0 )) && [[ ${ZAYA_FAILED_AT:-} == "$(latest_iteration)" ]]; then
        log "giving up: failed again at the same checkpoint ($(latest_iteration)) as before the last restart, so" \
            "the failure is reproducible (exit code $RC); see $ATTEMPT_DIR/rank-*.log"
        exit "$RC"
    fi
    if (( ${#BAD[@]} >= NNODES )); then
        # Every node failed by itself: a software, data or configuration error, not a node fault. (On a
        # single-node job the same: its only node failing looks like a software error as much as a node
        # fault; HEALTH_CHECK_CMD can tell them apart.)
        BAD=()
        if [[ $(latest_iteration) == "$LATEST_AT_START" ]]; then
            log "giving up: every node failed before a new checkpoint was written, so a restart would fail the" \
                "same way (exit code $RC); see $ATTEMPT_DIR/rank-*.log"
            exit "$RC"
        fi
        if (( NNODES == 1 )); then
            log "the job's only node failed by itself after a new checkpoint: restarting, not excluding it" \
                "(set HEALTH_CHECK_CMD to exclude it when it is broken)"
        else
            log "every node failed by itself after a new checkpoint: restarting, not excluding any node"
        fi
    fi
    if [[ -n ${HEALTH_CHECK_CMD:-} ]]; then
        log "health check on every node: $HEALTH_CHECK_CMD"
        # One task per node: the job's SLURM_NTASKS (inherited by srun) would otherwise run it once per task.
        TERMS_BEFORE=${RECEIVED[TERM]}
        ok=$(timeout "${HEALTH_CHECK_TIMEOUT:-120}" srun --nodes="$NNODES" --ntasks="$NNODES" --ntasks-per-node=1 \
             --kill-on-bad-exit=0 bash -c "( $HEALTH_CHECK_CMD
    ) >/dev/null 2>&1 && echo OK:\${SLURMD_NODENAME:-\$(hostname)} || echo FAILED:\${SLURMD_NODENAME:-\$(hostname)}" \
             2>/dev/null)
        HC_RC=$?
        HC_BAD=()
        while read -r n; do
            grep -qx "OK:$n" <<< "$ok" || HC_BAD+=("$n")
        done < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
        # Not used: a check that Slurm cut short (a SIGTERM came: it ends the job's steps), one whose srun ran
        # nowhere (past the time limit: "job has expired"; a hang that timed out is a failure), and one that failed
        # on every node of a multi-node job (the check's own fault, more likely than every node's).
        if (( RECEIVED[TERM] > TERMS_BEFORE )); then
            log "a SIGTERM came during the health check, which Slurm then ends: its result is not used"
        elif (( HC_RC != 124 )) && [[ $ok != *OK:* && $ok != *FAILED:* ]]; then
            log "the health check ran on no node (its srun exited $HC_RC): not used to blame nodes"
        elif (( NNODES > 1 && ${#HC_BAD[@]} >= NNODES )); then
            log "the health check failed on every node: taken for a fault of the check ($HEALTH_CHECK_CMD), not" \
                "of every node; no node excluded for it"
        else
            for n in "${HC_BAD[@]}"; do BAD[$n]=1; done
        fi
    fi

    EXCLUDE=${ZAYA_EXCLUDE:-${EXCLUDE_NODES:-}}
    for n in "${!BAD[@]}"; do
        [[ ,$EXCLUDE, == *,$n,* ]] || EXCLUDE=${EXCLUDE:+$EXCLUDE,}$n
    done
    BAD_LIST=$(IFS=,; echo "${!BAD[*]}")
    log "failed nodes: ${BAD_LIST:-none identified}"

    if (( RESTART >= ${MAX_RESTARTS:-3} )); then
        log "giving up: MAX_RESTARTS=${MAX_RESTARTS:-3} restarts already used (exit code $RC)"
        exit "$RC"
    fi

    # The resubmission: this script again (its #SBATCH header applies), same size, after this job, without
    # the failed nodes, with the settings of this job that Slurm reports (scontrol show job, else Slurm's
    # variables): partition, account, QOS, reservation, constraint (Features), GRES per node (or
    # --gpus-per-node), CPUs, memory and GPUs per task / CPU / GPU, mail settings, time limit. SBATCH_ARGS
    # (the submission's own flags, e.g. the recipe's) come first; RESUBMIT_ARGS last, so they win.
    # Anything else: put it in SBATCH_ARGS or RESUBMIT_ARGS.
    JOB_INFO=$(scontrol show job -o "$JOB_ID" 2>/dev/null | head -n1)
    job_field() {
        local v
        v=$(tr ' ' '\n' <<< "$JOB_INFO" | sed -n "s/^$1=//p" | head -n1)
        [[ -n $v && $v != "(null)" && $v != N/A ]] && echo "$v"
        return 0
    }
    SUB=(sbatch --parsable)
    if [[ -n ${SBATCH_ARGS:-} ]]; then
        read -r -a sba <<< "$SBATCH_ARGS"
        SUB+=("${sba[@]}")
    fi
    SUB+=(--dependency=afterany:"$JOB_ID" --job-name="$JOB_NAME" --chdir="$SUBMIT_DIR"
          --nodes="$NNODES" --ntasks-per-node="$NTASKS_PER_NODE")
    [[ -n $EXCLUDE ]] && SUB+=(--exclude="$EXCLUDE")
    CARRIED=()
    carry() { [[ -n $2 ]] && SUB+=("$1=$2") && CARRIED+=("$1=$2"); return 0; }
    carry --partition "${SLURM_JOB_PARTITION:-$(job_field Partition)}"
    carry --account "${SLURM_JOB_ACCOUNT:-$(job_field Account)}"
    carry --qos "${SLURM_JOB_QOS:-$(job_field QOS)}"
    carry --reservation "${SLURM_JOB_RESERVATION:-$(job_field Reservation)}"
    carry --constraint "$(job_field Features)"
    GRES=()
    IFS=, read -r -a tres <<< "$(job_field TresPerNode)"
    for t in "${tres[@]}"; do                 # gres:gpu:8 or gres/gpu:8 -> gpu:8
        [[ $t == gres[:/]* ]] || continue
        t=${t#gres?}
        [[ -n ${SLURM_GPUS_PER_NODE:-} && $t == gpu[:=]* ]] && continue     # carried as --gpus-per-node
        GRES+=("${t/=/:}")
    done
    carry --gpus-per-node "${SLURM_GPUS_PER_NODE:-}"
    carry --gres "$(IFS=,; echo "${GRES[*]}")"
    # Requests sbatch exports to the batch script (run_clean drops the variables, so they come back as flags):
    # without --cpus-per-task the resubmitted ranks would get one CPU each for their data workers.
    carry --cpus-per-task "${SLURM_CPUS_PER_TASK:-}"
    carry --mem "${SLURM_MEM_PER_NODE:-}"
    carry --mem-per-cpu "${SLURM_MEM_PER_CPU:-}"
    carry --mem-per-gpu "${SLURM_MEM_PER_GPU:-}"
    carry --gpus "${SLURM_GPUS:-}"
    carry --gpus-per-task "${SLURM_GPUS_PER_TASK:-}"
    carry --cpus-per-gpu "${SLURM_CPUS_PER_GPU:-}"
    MAIL_TYPE=$(job_field MailType)
    if [[ -n $MAIL_TYPE && $MAIL_TYPE != NONE ]]; then
        carry --mail-type "$MAIL_TYPE"
        carry --mail-user "$(job_field MailUser)"
    fi
    LIMIT=$(job_field TimeLimit)
    [[ -z $LIMIT ]] && LIMIT=$(squeue -h -j "$JOB_ID" -o %l 2>/dev/null | head -n1)
    [[ $LIMIT != UNLIMITED && $LIMIT != INFINITE ]] && carry --time "$LIMIT"
    if [[ -n ${RESUBMIT_ARGS:-} ]]; then
        read -r -a ra <<< "$RESUBMIT_ARGS"
        SUB+=("${ra[@]}")
    fi
    SUB+=("$SCRIPT_PATH" "${TRAINER_EXTRA[@]}")
    log "the resubmission carries: ${CARRIED[*]:-no settings of this job}${SBATCH_ARGS:+; SBATCH_ARGS=$SBATCH_ARGS}"
    stop_for_late_sigterm
    TERMS_BEFORE=${RECEIVED[TERM]}
    # sbatch runs with SIGTERM and SIGINT ignored: a scancel's SIGTERM reaches every process of the batch step,
    # and an sbatch it killed after the controller took the job would leave that job queued without its id.
    # Its stdout alone holds the id (--parsable: "ID" or "ID;CLUSTER"); its stderr (a job_submit plugin's
    # message, a warning) goes to the log, and stays in the attempt's folder.
    SUBMIT_ERR=$ATTEMPT_DIR/sbatch.err
    NEW=$(run_clean ZAYA_RESTART=$(( RESTART + 1 )) ZAYA_EXCLUDE="$EXCLUDE" ZAYA_FAILED_AT="$(latest_iteration)" \
          LAUNCHER_PATH="$SCRIPT_PATH" bash -c 'trap "" TERM INT; exec "$@"' sbatch "${SUB[@]}" 2> "$SUBMIT_ERR")
    SUBMITTED=$?
    SAID=$(tr '\n' ' ' < "$SUBMIT_ERR")
    [[ -n $SAID ]] && log "sbatch: $SAID"
    NEW=$(tail -n 1 <<< "$NEW")
    [[ $NEW =~ ^([0-9]+)(;.*)?$ ]] && NEW=${BASH_REMATCH[1]} || NEW=""
    # A cancellation (or preemption) whose SIGTERM came while sbatch ran: take the resubmission back.
    if (( RECEIVED[TERM] > TERMS_BEFORE )) && [[ $(time_limit_reached) != limit ]]; then
        if [[ -z $NEW ]]; then
            log "SIGTERM came while the resubmission was submitted (cancelled or preempted); sbatch exited" \
                "$SUBMITTED without a job id"
        elif scancel "$NEW"; then
            log "SIGTERM came while the resubmission was submitted (cancelled or preempted): cancelled job $NEW"
        else
            log "warning: SIGTERM came while the resubmission was submitted, and scancel $NEW failed: cancel it by hand"
        fi
        exit "$RC"
    fi
    if (( SUBMITTED != 0 )) || [[ -z $NEW ]]; then
        log "error: resubmission failed (sbatch exited $SUBMITTED${NEW:+, job $NEW})"
        exit "$RC"
    fi
    if [[ -n $CKPT_DIR ]]; then FROM="resuming from iteration $(latest_iteration)"
    else FROM="starting over from iteration 0 (CKPT_DIR is empty: nothing to resume from)"; fi
    log "resubmitted as job $NEW (restart $(( RESTART + 1 ))/${MAX_RESTARTS:-3}," \
        "excluding ${EXCLUDE:-no nodes})," \
        "$FROM: $(printf '%q ' "${SUB[@]}")"
    exit "$RC"
}
