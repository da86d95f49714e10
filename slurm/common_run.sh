# Part of slurm/common.sh's body, sourced by it inside a job once the checks passed (not run on its own): srun in
# the background with SIGUSR1/SIGTERM forwarded to it, the hang watch, and the requeue decision (a save on a stop
# signal, a hang without progress, or a person's scancel, which is never undone).

# ---- run ---------------------------------------------------------------------------------------------
export MASTER_ADDR MASTER_PORT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$CPUS_PER_TASK}
if [ "$DEVICE" = gpu ]; then
    # Fail fast instead of hanging on a broken peer; async error handling lets the trainer's collective
    # time out and the job end (and be requeued) rather than burn its allocation.
    export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}
    export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}  # Megatron TP/SP overlap
fi
mkdir -p "$RUN_DIR"
# Ranks that exit with the requeue code touch this file (slurm/rank_env.sh); it lives in the run
# directory because that is on storage every node shares (checkpoints need it anyway).
export REQUEUE_EXIT_CODE
export POSAUG_REQUEUE_MARKER=$RUN_DIR/.requeue-request-$SLURM_JOB_ID
rm -f "$POSAUG_REQUEUE_MARKER"

# Bash runs traps only between commands, so srun runs in the background and we `wait` for it: a
# signal interrupts `wait`, the trap forwards it to srun (which forwards it to every task), and we go
# back to waiting for the trainer to save and exit.
_SRUN_PID=
_forward() {
    _log "received SIG$1: forwarding to the training step"
    [ -n "$_SRUN_PID" ] && kill -s "$1" "$_SRUN_PID" 2>/dev/null || true
}
trap '_forward USR1' USR1
trap '_forward TERM' TERM

_STARTED=$(date +%s)
_HANG_REPORT=$RUN_DIR/hang/report.txt
_hang_reported() { [ -f "$_HANG_REPORT" ] && [ "$(stat -c %Y "$_HANG_REPORT" 2>/dev/null || echo 0)" -ge "$_STARTED" ]; }
# srun waits for every task's exit message; after a partition the tasks on a node cut off from this (batch)
# node never get theirs through. HANG_SRUN_GRACE s after the hang report the job's steps are cancelled through
# slurmctld (which still reaches every node), and srun is ended if it still waits.
HANG_SRUN_GRACE=${HANG_SRUN_GRACE:-10}
_job_steps() { squeue -h -s -j "$SLURM_JOB_ID" -o %i 2>/dev/null | grep -E '^[0-9]+\.[0-9]+$' || true; }
_watch_hang() {
    while kill -0 "$_SRUN_PID" 2>/dev/null; do
        if _hang_reported; then
            sleep "$HANG_SRUN_GRACE"
            if kill -0 "$_SRUN_PID" 2>/dev/null; then
                _log "srun still waits ${HANG_SRUN_GRACE} s after the hang report (for a node it cannot reach): cancelling the step"
                for _step in $(_job_steps); do scancel "$_step" 2>/dev/null || true; done
                sleep 5
                kill -KILL "$_SRUN_PID" 2>/dev/null || true
            fi
            return 0
        fi
        sleep 2
    done
}
set +e
"${SRUN_CMD[@]}" "${TRAIN_CMD[@]}" &
_SRUN_PID=$!
_watch_hang &
_WATCH_PID=$!
while :; do
    wait "$_SRUN_PID"; rc=$?
    [ "$rc" -gt 128 ] || break
    # >128: srun died of a signal, or a trapped signal interrupted `wait` while srun runs on.
    if ! kill -0 "$_SRUN_PID" 2>/dev/null; then wait "$_SRUN_PID"; rc=$?; break; fi
done
kill "$_WATCH_PID" 2>/dev/null
set -e
_log "training step exited with code $rc"
if [ -e "$POSAUG_REQUEUE_MARKER" ]; then
    rm -f "$POSAUG_REQUEUE_MARKER"
    _log "the trainer saved a checkpoint on a stop signal (exit code $REQUEUE_EXIT_CODE)"
    [ "$rc" = 0 ] && rc=$REQUEUE_EXIT_CODE
fi

# A hang report written by this attempt: name the node(s), and requeue unless hangs keep coming without progress.
if _hang_reported; then
    _log "the trainer reported a hang: $(head -n1 "$_HANG_REPORT")"
    _hung_hosts=$(sed -n 's/^hosts: *//p' "$_HANG_REPORT")
    if [ -n "$_hung_hosts" ]; then
        _log "hung node(s): $_hung_hosts (to keep them out: sbatch --exclude=${_hung_hosts// /,} ...)"
    fi
    _latest=$(cat "$RUN_DIR/latest_checkpointed_iteration.txt" 2>/dev/null || echo none)
    _hangs=0 _hang_at=
    [ -f "$RUN_DIR/.hang-requeues" ] && read -r _hangs _hang_at < "$RUN_DIR/.hang-requeues"
    if [ "${_hang_at:-}" = "$_latest" ]; then _hangs=$(( ${_hangs:-0} + 1 )); else _hangs=1; fi
    echo "$_hangs $_latest" > "$RUN_DIR/.hang-requeues"
    if [ "$REQUEUE" = 1 ] && [ "$_hangs" -le "$MAX_HANG_REQUEUES" ]; then
        _log "hang $_hangs of at most $MAX_HANG_REQUEUES in a row at checkpoint $_latest: requeueing job $SLURM_JOB_ID (it will resume from $RUN_DIR)"
        # a step still ending on a node (its slurmstepd kills late) must be gone before the requeued job starts there
        for _ in $(seq 60); do [ -z "$(_job_steps)" ] && break; sleep 1; done
        if scontrol requeue "$SLURM_JOB_ID"; then
            exit 0
        fi
        _log "scontrol requeue failed (job not requeueable here?); resubmit to resume"
    elif [ "$REQUEUE" = 1 ]; then
        _log "not requeueing: $_hangs hangs in a row with no checkpoint after $_latest (MAX_HANG_REQUEUES=$MAX_HANG_REQUEUES); look at the stacks in $RUN_DIR/hang, exclude the node(s) named above and resubmit"
    fi
    exit "$HANG_EXIT_CODE"
fi

# `scancel JOB` (a person ending the job) also reaches the trainer as SIGTERM; it must not be undone by a requeue
# (scontrol requeue takes a cancelled job back). slurmctld shows such a job COMPLETING with no reason, while a
# time limit says Reason=TimeLimit and `scancel --signal` leaves it RUNNING.
_cancelled() {
    local show
    show=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null) || return 1
    case "$show" in *JobState=RUNNING*) return 1 ;; esac
    case "$show" in *JobState=CANCELLED*|*"Reason=None"*) return 0 ;; esac
    return 1
}
if [ "$rc" = "$REQUEUE_EXIT_CODE" ] && [ "$REQUEUE" = 1 ] && _cancelled; then
    _log "job $SLURM_JOB_ID was cancelled (scancel): not requeueing; the checkpoint in $RUN_DIR is kept, submit again to resume"
elif [ "$rc" = "$REQUEUE_EXIT_CODE" ] && [ "$REQUEUE" = 1 ]; then
    # The trainer saved a checkpoint because it was told to stop (time limit, preemption). Put this
    # same job back in the queue; it resumes from the checkpoint when it starts again.
    _log "requeueing job $SLURM_JOB_ID (it will resume from $RUN_DIR)"
    if scontrol requeue "$SLURM_JOB_ID"; then
        exit 0
    fi
    _log "scontrol requeue failed (job not requeueable here?); resubmit to resume"
fi
exit "$rc"
