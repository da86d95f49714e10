# Sourced by stop.sh and stop_two_nodes.sh (each defines log() first).

stop_pidfile() {  # stop_pidfile NAME FILE: SIGTERM, wait up to 30 s, then SIGKILL
    local name=$1 file=$2 pid
    if [ ! -s "$file" ]; then log "$name: no PID file ($file)"; return 0; fi
    pid=$(cat "$file")
    if ! kill -0 "$pid" 2>/dev/null; then log "$name: not running (stale PID $pid)"; rm -f "$file"; return 0; fi
    log "stopping $name (pid $pid)"
    kill -TERM "$pid"
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then log "$name did not exit in 30 s: SIGKILL"; kill -KILL "$pid"; fi
    rm -f "$file"
}
