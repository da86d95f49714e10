#!/usr/bin/env bash
# Stop the two-node cluster started by slurm/local/start_two_nodes.sh: the slurmds, slurmctld and the
# private munged by their PID files (never by process name: the single-node cluster and any other
# SLURM on the machine survive), then whatever still runs in the two namespaces (leftover job steps;
# only processes inside namespaces this script's sibling created), then the namespaces and the bridge.
# Idempotent. State under $SLURM_TWO_NODES_DIR is kept, so start_two_nodes.sh brings back the same cluster.
#   STOP_NETWORK=0 STOP_MUNGE=0 slurm/local/stop_two_nodes.sh    daemons only (start_two_nodes.sh uses it)
set -euo pipefail

D=${SLURM_TWO_NODES_DIR:-/var/lib/slurm-two-nodes}
STOP_NETWORK=${STOP_NETWORK:-1}
STOP_MUNGE=${STOP_MUNGE:-1}
BRIDGE=posaug2n-br
NODES=(node1 node2)

log() { echo "[slurm-two-nodes] $*"; }

# shellcheck source=pidfile.sh
source "$(dirname "${BASH_SOURCE[0]}")/pidfile.sh"

for n in "${NODES[@]}"; do stop_pidfile "slurmd $n" "$D/run/slurmd-$n.pid"; done
stop_pidfile slurmctld "$D/run/slurmctld.pid"
if [ "$STOP_MUNGE" = 1 ]; then stop_pidfile munged "$D/munge/munged.pid"; fi

if [ "$STOP_NETWORK" = 1 ]; then
    for n in "${NODES[@]}"; do
        netns=posaug2n-$n
        [ -e "/run/netns/$netns" ] || continue
        # Job steps outlive slurmd; in a namespace we created they can only be this cluster's.
        pids=$(ip netns pids "$netns")
        if [ -n "$pids" ]; then
            log "killing leftover processes in $netns: $(echo $pids)"
            kill -KILL $pids 2>/dev/null || true
        fi
        log "deleting network namespace $netns"
        ip netns del "$netns"   # also deletes its veth pair
    done
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        log "deleting bridge $BRIDGE"
        ip link del "$BRIDGE"
    fi
fi
