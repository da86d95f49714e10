"""How a hang ends: the watchdog's SIGKILL of a silent rank on its own host, and its own exit with HANG_EXIT_CODE.

A heartbeat's pid may be stale by the time the report is written (the rank died and the pid was reused), so a
rank is named by (host, pid, start time) and killed only while /proc still shows that start time. A rank stopped
before its first heartbeat is found by its launch environment instead (`find_rank`): torchrun and srun
(slurm/rank_env.sh) start every rank with RANK and the job's MASTER_ADDR / MASTER_PORT, which tell one job's
rank N from another job's on a shared node. Without that, torchrun's SIGTERM cannot end it (stopped) and the job
waits another 30 s for torchrun's SIGKILL.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

HANG_EXIT_CODE = 76  # not 1 (a crash), 2 (bad input) or 75 (saved on a signal, requeue); slurm/common.sh reads it


def _stat_field(pid: int, field: int) -> int | None:
    """Field `field` (1-based, as proc(5) numbers them, 3 or later) of /proc/<pid>/stat, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: the fields that follow start after the last ')'
    return int(stat[stat.rindex(")") + 2:].split()[field - 3])


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat), or None if it is gone."""
    return _stat_field(pid, 22)


def identity() -> dict:
    """This process as a heartbeat names it: host, pid and start time."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "start_time": start_time(os.getpid())}


LAUNCH_KEYS = ("MASTER_ADDR", "MASTER_PORT")  # with RANK: one rank of one job


def launch_environment(pid: int) -> dict[str, str] | None:
    """The environment a process was started with (/proc/<pid>/environ), or None if it is gone or not ours."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def find_rank(rank: int) -> dict | None:
    """The identity record of this job's rank `rank` on this host, found by its launch environment (RANK and this
    process's MASTER_ADDR / MASTER_PORT); None when no such process runs here. Its child processes inherit the
    environment, so the one whose parent is not a match is the rank."""
    job = {key: os.environ.get(key) for key in LAUNCH_KEYS}
    if None in job.values() or os.environ.get("RANK") == str(rank):
        return None
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid, began = int(entry), start_time(int(entry))
        env = launch_environment(pid)
        if env and env.get("RANK") == str(rank) and all(env.get(key) == job[key] for key in LAUNCH_KEYS):
            found[pid] = began
    for pid, began in found.items():
        if _stat_field(pid, 4) not in found and began is not None:  # field 4: the parent's pid
            return {"host": socket.gethostname(), "pid": pid, "start_time": began}
    return None


def kill_rank(record: dict) -> str | None:
    """SIGKILL the process a heartbeat names, with its children, if it is still that process; else why not."""
    if record.get("host") != socket.gethostname():
        return f"not killed: on {record.get('host')}, not on this host"
    pid, wanted = record.get("pid"), record.get("start_time")
    if pid is None or wanted is None:
        return "not killed: its heartbeat has no pid and start time"
    now = start_time(pid)
    if now != wanted:
        return (f"not killed: pid {pid} " + ("has ended" if now is None else
                f"is another process now (started at tick {now}, not {wanted})"))
    kill_tree(pid)
    return None


def children(pid: int) -> list[int]:
    """The direct children of a process (every thread's), from /proc."""
    try:
        return [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                for c in (task / "children").read_text().split()]
    except OSError:
        return []


def kill_tree(pid: int) -> None:
    """SIGKILL a process and its children (Megatron's checkpoint-writer process would outlive it, holding the
    launcher's output pipes open)."""
    for victim in [*children(pid), pid]:
        try:
            os.kill(victim, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def exit_now() -> None:
    """End this process with HANG_EXIT_CODE, its child processes first (os._exit runs no atexit handler that
    would stop them)."""
    sys.stdout.flush()
    sys.stderr.flush()
    for child in children(os.getpid()):
        kill_tree(child)
    os._exit(HANG_EXIT_CODE)
