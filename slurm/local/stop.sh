#!/usr/bin/env bash
# Stop the local development cluster started by slurm/local/start.sh: slurmd, slurmctld, then munged,
# each by its PID file (never by process name, so other SLURM/munge instances on the machine survive).
# Idempotent: a missing PID file or a dead process is fine. State under $SLURM_LOCAL_DIR is kept, so
# start.sh brings back the same cluster (queued jobs included).
#   STOP_MUNGE=0 slurm/local/stop.sh   keeps munged running (e.g. when something else uses it)
set -euo pipefail

SLURM_LOCAL_DIR=${SLURM_LOCAL_DIR:-/var/lib/slurm-local}
RUN_DIR=$SLURM_LOCAL_DIR/run
STOP_MUNGE=${STOP_MUNGE:-1}

log() { echo "[slurm-local] $*"; }

# shellcheck source=pidfile.sh
source "$(dirname "${BASH_SOURCE[0]}")/pidfile.sh"

stop_pidfile slurmd "$RUN_DIR/slurmd.pid"
stop_pidfile slurmctld "$RUN_DIR/slurmctld.pid"
if [ "$STOP_MUNGE" = 1 ]; then
    # munged's compiled-in PID file (start.sh starts it with the defaults).
    stop_pidfile munged /run/munge/munged.pid
fi
