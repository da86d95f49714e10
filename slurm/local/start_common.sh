# Sourced by start.sh and start_two_nodes.sh (each defines log() first): what bringing up either local cluster
# does the same way. Each script keeps what differs: its names, ports, paths, network and munged socket.

pid_alive() {  # pid_alive FILE -> true when FILE names a running process
    [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

# node_hardware PERCENT: this machine as slurmd measures it, with PERCENT of its memory. A node declared any other
# way registers as "invalid" and is drained; a RealMemory above what slurmd measures drains it too.
node_hardware() {
    local hw key value out=""
    hw=$(slurmd -C | head -1)
    for key in CPUs Boards SocketsPerBoard CoresPerSocket ThreadsPerCore; do
        value=$(sed -n "s/.*\b$key=\([0-9]*\).*/\1/p" <<<"$hw")
        out+="$key=$value "
    done
    value=$(sed -n 's/.*\bRealMemory=\([0-9]*\).*/\1/p' <<<"$hw")
    echo "${out}RealMemory=$(( value * $1 / 100 ))"
}

# make_munge_key FILE: a new 1 KiB key owned by munge, 0400 (munged refuses any other owner or mode).
make_munge_key() {
    dd if=/dev/urandom of="$1" bs=1 count=1024 status=none
    chown munge:munge "$1"
    chmod 0400 "$1"
}

# shared_conf: slurm.conf settings both clusters use. Jobs run as root here (CI and the container's user); no
# cgroups in containers, so processes are tracked through /proc and nothing is bound; no accounting daemon.
shared_conf() {
    cat <<'CONF'
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Batch jobs may be requeued (the launchers requeue themselves on a stop signal and after a hang).
JobRequeue=1
# A node that comes back (its slurmd re-registers) takes jobs again without an admin's RESUME.
ReturnToService=2
SlurmctldTimeout=30
InactiveLimit=0
# Finished jobs stay visible to "scontrol show job" for an hour: a test module reads a job it submitted at its start
# again at its end (the two-node layout runs), which took longer than the default 5 minutes on a loaded machine;
# a purged job reads as no state at all and its wait times out.
MinJobAge=3600
Waittime=0
SchedulerParameters=sched_interval=2
CONF
}

# write_conf FILE TEXT: write FILE when its text changed; conf_changed=1 then (daemons read some settings, such as
# ports and AuthInfo, only when they start), else 0.
write_conf() {
    if [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; then
        conf_changed=0
    else
        log "writing $1"
        printf '%s\n' "$2" >"$1"
        conf_changed=1
    fi
}

# nodes_ready NODE...: every node takes jobs. A node lost earlier stays DOWN (or drained) until resumed, even
# with ReturnToService, so it is resumed here and counts as not ready yet.
nodes_ready() {
    local n state
    for n in "$@"; do
        state=$(sinfo -h -N -n "$n" -o '%T' 2>/dev/null || true)
        case "$state" in
            idle|mixed|allocated|completing) ;;
            drain*|down*|fail*) scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true; return 1 ;;
            *) return 1 ;;
        esac
    done
}

wait_for_nodes() {  # wait_for_nodes NODE...: up to 60 s for nodes_ready
    for _ in $(seq 120); do nodes_ready "$@" && return 0; sleep 0.5; done
    nodes_ready "$@"
}
