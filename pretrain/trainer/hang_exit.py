"""How a hang ends: the watchdog's SIGKILL of a silent rank on its own host, and its own exit with HANG_EXIT_CODE.

A heartbeat's pid may be stale by the time the report is written (the rank died and the pid was reused), so a
rank is named by (host, pid, start time) and killed only while /proc still shows that start time.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

HANG_EXIT_CODE = 76  # not 1 (a crash), 2 (bad input) or 75 (saved on a signal, requeue); slurm/common.sh reads it


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: the fields that follow start after the last ')'
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[22 - 3])


def identity() -> dict:
    """This process as a heartbeat names it: host, pid and start time."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "start_time": start_time(os.getpid())}


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
