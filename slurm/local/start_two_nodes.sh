#!/usr/bin/env bash
# Start a real two-node SLURM cluster on this one machine, for debugging the launchers' multi-node path
# (node list -> rendezvous address -> one task per rank on every node -> process group) and for CI.
#
#   sudo slurm/local/start_two_nodes.sh
#   export SLURM_CONF=/var/lib/slurm-two-nodes/etc/slurm.conf     # printed at the end
#   sbatch -N 2 --ntasks-per-node=1 ... slurm/pretrain_113m_posaug.sh
#   slurm/local/stop_two_nodes.sh
#
# Layout: nodes `node1` and `node2` are two network namespaces (posaug2n-node1/2) with their own address
# ($SLURM_TWO_NODES_NET.11 / .12), hostname and /etc/hosts, joined by a bridge whose host side
# ($SLURM_TWO_NODES_NET.1) is where slurmctld listens. Each runs its own slurmd; slurmctld and a private
# munged (own key, own socket) run in the host namespace on their own ports (7817/7818), so this cluster
# coexists with the single-node one of slurm/local/start.sh (6817/6818, /run/munge). The namespaces
# have no default route: nothing leaves the bridge. Everything else (config, state, spool, logs, PID
# files) lives under $SLURM_TWO_NODES_DIR.
#
# Idempotent: each piece (bridge, namespace, veth, munged, slurmctld, each slurmd) is created or started
# only when missing, so re-running it after a node was lost (slurmd killed) brings that node back alone.
# A changed config restarts the daemons.
#
# Exit codes: 0 up, 1 failed to come up, 3 this machine cannot run it (not root, no network-namespace
# rights): callers such as `make test` treat 3 as "skip", with the printed reason.
#
# Facts this is built on (Debian 12, SLURM 22.05, util-linux 2.38):
# - `ip netns exec` remounts /sys, which hides /sys/fs/cgroup, and slurmd then dies ("Unable to
#   initialize cgroup plugin"); `nsenter --net` + `unshare --mount --uts` keeps /sys and still gives
#   each node its own hostname and a bind-mounted hosts file;
# - SlurmdSpoolDir (with %n) must exist before slurmd starts;
# - munged refuses a socket directory that is not 0755;
# - without `::ffff:<ip> nodeN` lines in the hosts file, torch logs reverse-lookup errors for
#   IPv4-mapped peer addresses.
set -euo pipefail

SLURM_TWO_NODES_DIR=${SLURM_TWO_NODES_DIR:-/var/lib/slurm-two-nodes}
SLURM_TWO_NODES_NET=${SLURM_TWO_NODES_NET:-10.77.0}
SLURM_TWO_NODES_CTLD_PORT=${SLURM_TWO_NODES_CTLD_PORT:-7817}
SLURM_TWO_NODES_SLURMD_PORT=${SLURM_TWO_NODES_SLURMD_PORT:-7818}
D=$SLURM_TWO_NODES_DIR
NET=$SLURM_TWO_NODES_NET
CONF=$D/etc/slurm.conf
BRIDGE=posaug2n-br
NODES=(node1 node2)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

log() { echo "[slurm-two-nodes] $*"; }
die() { echo "[slurm-two-nodes] ERROR: $*" >&2; exit 1; }
unsupported() { echo "[slurm-two-nodes] UNSUPPORTED: $*" >&2; exit 3; }
# shellcheck source=start_common.sh
source "$HERE/start_common.sh"
ns() { echo "posaug2n-$1"; }              # network namespace of a node
veth() { echo "posaug2n-v${1#node}"; }     # host side of a node's veth pair
addr() { echo "$NET.1${1#node}"; }         # node1 -> .11, node2 -> .12

# --- can this machine do it? --------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || unsupported "needs root (network namespaces, a bridge and system daemons)"
for tool in ip nsenter unshare slurmctld slurmd munged; do
    command -v "$tool" >/dev/null || die "'$tool' not found: install the packages first (make system-deps, or slurm/local/start.sh)"
done
probe=posaug2n-probe-$$
if ! err=$(ip netns add "$probe" 2>&1); then
    unsupported "cannot create network namespaces here (ip netns add: ${err:-failed})"
fi
ip netns del "$probe"

mkdir -p "$D"/{etc,state,run,log,munge} "${NODES[@]/#/$D/spool/slurmd-}" "${NODES[@]/#/$D/tmp/}"

# --- network: bridge + one namespace and veth pair per node -------------------------------------------
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    log "creating bridge $BRIDGE ($NET.1/24)"
    ip link add "$BRIDGE" type bridge
    ip addr add "$NET.1/24" dev "$BRIDGE"
fi
ip link set "$BRIDGE" up
for n in "${NODES[@]}"; do
    if [ ! -e "/run/netns/$(ns "$n")" ]; then
        log "creating network namespace $(ns "$n") for $n ($(addr "$n"))"
        ip netns add "$(ns "$n")"
    fi
    if ! ip link show "$(veth "$n")" >/dev/null 2>&1; then
        ip link add "$(veth "$n")" type veth peer name eth0 netns "$(ns "$n")"
        ip -n "$(ns "$n")" addr add "$(addr "$n")/24" dev eth0
    fi
    ip link set "$(veth "$n")" master "$BRIDGE" up
    ip -n "$(ns "$n")" link set eth0 up
    ip -n "$(ns "$n")" link set lo up
done
hosts="127.0.0.1 localhost
$NET.1 posaug2n-ctl"
for n in "${NODES[@]}"; do hosts+=$'\n'"$(addr "$n") $n"$'\n'"::ffff:$(addr "$n") $n"; done
printf '%s\n' "$hosts" >"$D/etc/hosts"

# --- private munged -----------------------------------------------------------------------------------
chown munge:munge "$D/munge"
chmod 0755 "$D/munge"
if [ ! -s "$D/munge/munge.key" ]; then
    make_munge_key "$D/munge/munge.key"
fi
if pid_alive "$D/munge/munged.pid"; then
    log "munged already running (pid $(cat "$D/munge/munged.pid"))"
else
    log "starting munged (socket $D/munge/munge.socket)"
    # --force: a stale socket from a killed munged would otherwise stop it from starting.
    runuser -u munge -- /usr/sbin/munged --force --socket="$D/munge/munge.socket" \
        --key-file="$D/munge/munge.key" --pid-file="$D/munge/munged.pid" \
        --log-file="$D/munge/munged.log" --seed-file="$D/munge/munged.seed"
    for _ in $(seq 50); do [ -S "$D/munge/munge.socket" ] && break; sleep 0.1; done
fi

# --- slurm.conf ---------------------------------------------------------------------------------------
# Each node declares the machine's real topology (the same in every namespace) and 45 % of its memory, as they
# share it.
node_hw=$(node_hardware 45)
new_conf=$(cat <<CONF
# Generated by slurm/local/start_two_nodes.sh: two nodes in network namespaces on one machine.
ClusterName=posaug2n
SlurmctldHost=localhost($NET.1)
SlurmctldPort=$SLURM_TWO_NODES_CTLD_PORT
SlurmdPort=$SLURM_TWO_NODES_SLURMD_PORT
# Own munged socket (clients read it from here too). cred_expire is also how long a requeued job waits
# before it may start again (default 120 s).
AuthInfo=socket=$D/munge/munge.socket,cred_expire=10
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/slurmd-%n
# Node-local scratch, as on a real cluster, while /tmp stays shared like a cluster file system: srun
# --mpi=pmix creates <TmpFS>/spmix_appdir_<uid>_<job>.<step> on every node and fails when the other
# node (or another cluster's job with the same id) already made it.
TmpFS=$D/tmp/%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
# The launchers choose: --mpi=none for training (env:// rendezvous), --mpi=pmix for data_prep.
MpiDefault=none
# A lost node is declared DOWN after SlurmdTimeout; short, so the node-loss test does not wait long.
SlurmdTimeout=10
KillWait=10
$(shared_conf)
NodeName=node1 NodeAddr=$(addr node1) NodeHostname=node1 $node_hw State=UNKNOWN
NodeName=node2 NodeAddr=$(addr node2) NodeHostname=node2 $node_hw State=UNKNOWN
PartitionName=two Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
)
write_conf "$CONF" "$new_conf"
export SLURM_CONF=$CONF

# --- daemons ------------------------------------------------------------------------------------------
if [ "$conf_changed" = 1 ] && { pid_alive "$D/run/slurmctld.pid" || pid_alive "$D/run/slurmd-node1.pid" \
                                 || pid_alive "$D/run/slurmd-node2.pid"; }; then
    # Ports and AuthInfo are read only at daemon start: restart, keeping the network and munged.
    log "config changed: restarting slurmctld and the slurmds"
    STOP_NETWORK=0 STOP_MUNGE=0 SLURM_TWO_NODES_DIR=$D "$HERE/stop_two_nodes.sh"
fi
if pid_alive "$D/run/slurmctld.pid"; then
    log "slurmctld already running (pid $(cat "$D/run/slurmctld.pid"))"
else
    log "starting slurmctld (port $SLURM_TWO_NODES_CTLD_PORT)"
    slurmctld -i -f "$CONF"
fi
for n in "${NODES[@]}"; do
    if pid_alive "$D/run/slurmd-$n.pid"; then
        log "slurmd $n already running (pid $(cat "$D/run/slurmd-$n.pid"))"
        continue
    fi
    log "starting slurmd $n in $(ns "$n")"
    nsenter --net="/run/netns/$(ns "$n")" unshare --mount --uts sh -c \
        "mount --bind '$D/etc/hosts' /etc/hosts && hostname $n && exec slurmd -N $n -f '$CONF'"
done

# --- wait until both nodes take jobs ------------------------------------------------------------------
wait_for_nodes "${NODES[@]}" || die "nodes are not idle: $(sinfo -h -N -o '%N %T' | tr '\n' ' '); see $D/log/"
log "cluster up: $(sinfo -h -N -o '%N=%T' | tr '\n' ' ')(${node_hw% RealMemory*} each)"
log "SLURM_CONF=$CONF"
