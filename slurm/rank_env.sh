#!/usr/bin/env bash
# Per-task wrapper run by `srun` (one task per GPU): turn SLURM's task identity into the torchrun-style
# environment the trainer reads, then exec the command. Everything else (MASTER_ADDR, MASTER_PORT,
# NCCL/OMP settings) is exported by slurm/common_run.sh in the batch script and inherited through srun.
#   SLURM_PROCID -> RANK      (global rank, 0 .. SLURM_NTASKS-1)
#   SLURM_LOCALID -> LOCAL_RANK (rank on this node; the trainer's CUDA device index)
#   SLURM_NTASKS -> WORLD_SIZE
set -euo pipefail

: "${SLURM_PROCID:?rank_env.sh runs under srun (SLURM_PROCID is not set)}"
export RANK=$SLURM_PROCID
export LOCAL_RANK=$SLURM_LOCALID
export WORLD_SIZE=$SLURM_NTASKS
export NODE_RANK=$SLURM_NODEID
# Tasks on this node: SLURM_NTASKS_PER_NODE is only set when --ntasks-per-node was given.
export LOCAL_WORLD_SIZE=${SLURM_NTASKS_PER_NODE:-${SLURM_TASKS_PER_NODE%%(*}}
# A line from every rank, so the job log shows all of them started (srun --label prefixes the rank).
echo "rank ${RANK}/${WORLD_SIZE} (node ${NODE_RANK} $(hostname), local rank ${LOCAL_RANK}) -> ${MASTER_ADDR:-?}:${MASTER_PORT:-?}"
# Not exec: the exit line below is the proof a rank finished, and the trainer's exit code (0, or the
# requeue code after a signal) is passed through unchanged. Signals from srun reach the trainer because
# srun signals every process of the task, and bash waits for it.
set +e
"$@" &
child=$!
forward() { kill -s "$1" "$child" 2>/dev/null || true; }
trap 'forward USR1' USR1
trap 'forward TERM' TERM
while :; do
    wait "$child"; rc=$?
    [ "$rc" -gt 128 ] || break
    # >128: the child died of a signal, or a trapped signal interrupted `wait` while the child runs on.
    # Once it is gone, `wait` again returns its real (remembered) status.
    if ! kill -0 "$child" 2>/dev/null; then wait "$child"; rc=$?; break; fi
done
echo "rank ${RANK} exited with code ${rc}"
# The trainer's requeue code (it saved a checkpoint on a signal) becomes a marker file plus a clean exit:
# with `srun --kill-on-bad-exit=1`, a rank exiting 75 first would get the others killed while they are
# still finishing, and srun would then report 143 instead of 75. The batch script looks for the marker.
if [ -n "${POSAUG_REQUEUE_MARKER:-}" ] && [ "$rc" = "${REQUEUE_EXIT_CODE:-75}" ]; then
    touch "$POSAUG_REQUEUE_MARKER"
    exit 0
fi
exit "$rc"
