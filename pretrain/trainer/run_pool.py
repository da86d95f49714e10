"""Training runs as child processes, a few at a time: the one pool the task suite and the ablations share.

A process per run, because Megatron's global state (parallel groups, the microbatch calculator) does not leak
between runs that way. Each run gets cores // jobs OpenMP threads: these models are so small that two 1-thread
runs side by side beat one 2-thread run, and OpenMP threads that wait for a core on a busy machine spin (wall and
CPU time grow several-fold), single threads do not. Per-run wall and CPU seconds go to <timing_dir>/<name>.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from pretrain.faults import write_text_atomic


def machine() -> str:
    """This machine as its runs' numbers depend on it: processor, the CPU kernels torch picks, torch's version.

    The same seed and training code give other task-suite numbers on another machine (benchmarks/README.md).
    """
    import torch

    from pretrain.trainer.peak import processor

    return f"{processor()}, CPU kernels {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}"


def machines_text(invocations: list[dict]) -> str:
    """'; trained on A; B' for the invocation records that name their machine, and how many do not."""
    machines = sorted({r["machine"] for r in invocations if "machine" in r})
    unrecorded = sum("machine" not in r for r in invocations)
    if not machines:
        return ""
    return ("; trained on " + "; ".join(machines)
            + (f" ({unrecorded} earlier invocation(s) did not record their machine)" if unrecorded else ""))


def load_average() -> str:
    """The 1-minute load average as text (other jobs slow the wall clock, never the CPU time)."""
    return f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "?"


def _start(config_file: Path, log_file: Path, threads: int) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    with log_file.open("w") as log:
        return subprocess.Popen([sys.executable, "-m", "pretrain", "train", "--config", str(config_file)],
                                stdout=log, stderr=subprocess.STDOUT, env=env)


def _reap(proc: subprocess.Popen) -> tuple[int, float] | None:
    """(exit code, CPU seconds of the child) once it has ended, else None."""
    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    if pid == 0:
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def train_in_processes(names: list[str], *, jobs: int, write_config: Callable[[str], Path],
                       log_dir: Path, timing_dir: Path, on_start: Callable[[str, int, str], None],
                       on_end: Callable[[str, dict], None]) -> None:
    """Train each named run (`python -m pretrain train --config write_config(name)`), `jobs` at a time.

    on_start(name, runs still queued, ETA text) comes before each start and on_end(name, timing) after each
    finish; a failed run stops the others and raises RuntimeError naming it, its config and its log's tail.
    """
    todo = list(names)
    threads = max(1, (os.cpu_count() or 1) // jobs)
    log_dir.mkdir(parents=True, exist_ok=True)
    timing_dir.mkdir(parents=True, exist_ok=True)
    running: dict[str, tuple[subprocess.Popen, float, Path]] = {}
    walls: list[float] = []
    while todo or running:
        while todo and len(running) < jobs:
            name = todo.pop(0)
            # Runs in flight count whole: a slight overestimate, never the 2x of elapsed / finished.
            left = len(todo) + 1 + len(running)
            eta = f"; ETA {sum(walls) / len(walls) * left / jobs / 60:.1f} min" if walls else ""
            on_start(name, len(todo), eta)
            config_file = write_config(name)
            running[name] = (_start(config_file, log_dir / f"{name}.log", threads), time.time(), config_file)
        time.sleep(0.5)
        for name, (proc, begun, config_file) in list(running.items()):
            ended = _reap(proc)
            if ended is None:
                continue
            del running[name]
            code, cpu = ended
            log_file = log_dir / f"{name}.log"
            if code != 0:
                for other, _, _ in running.values():
                    other.kill()
                    other.wait()
                raise RuntimeError(f"training {name} failed (exit {code}, config {config_file}); log {log_file}:\n"
                                   f"{log_file.read_text()[-3000:]}")
            walls.append(time.time() - begun)
            timing = {"wall_s": walls[-1], "cpu_s": cpu, "threads": threads, "jobs": jobs,
                      "load_at_end": load_average()}
            write_text_atomic(timing_dir / f"{name}.json", json.dumps(timing), what="run timing")
            on_end(name, timing)
