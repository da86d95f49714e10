"""Run discovery: every training run under a directory with its size, method, seed, iteration and state
(finished / running / stopped / failed / hung). Below both its readers: `python -m pretrain runs`
(pretrain/experiments/runs.py) and `eval all` (pretrain/evaluation/all_runs.py).

A run directory is one holding the `config.yaml` the trainer writes. Its state comes from
the trainer's `status.json` and its newest complete checkpoint:

- finished: the newest checkpoint is at the run's last iteration;
- running: status.json says running and the process is alive (same host), or its heartbeat
  is recent (another host, e.g. a SLURM node);
- stopped: saved on SIGTERM/SIGUSR1 and exited for requeue;
- failed: the trainer recorded an exception, or it says running but its process is gone;
- hung: the hang watchdog ended the run (no step within the train timeout); the detail is its one line,
  naming the rank(s) and host(s) that stopped. A restart resumes from the newest checkpoint.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

from pretrain.naming import method_name, size_name

STALE_AFTER_S = 1800.0  # a "running" run on another host with no heartbeat for this long is reported failed


@dataclass
class Run:
    """One training run directory as `runs` reports it."""

    path: Path
    name: str
    size: str
    method: str
    seed: int | None
    iteration: int
    train_iters: int | None
    state: str
    detail: str = ""
    config: object = None  # the TrainConfig, when config.yaml parses

    @property
    def finished(self) -> bool:
        """True when the newest checkpoint is the run's last iteration."""
        return self.state == "finished"


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _age_s(timestamp: str | None) -> float | None:
    try:
        return (datetime.now(timezone.utc) - datetime.fromisoformat(timestamp)).total_seconds()
    except (TypeError, ValueError):
        return None


def damaged_newest(run_dir: Path, iteration: int) -> str | None:
    """'iter_N is damaged (why)' for the newest iter_* directory newer than the newest intact `iteration`, or None.

    Sizes only, as latest_iteration reads them: `runs` lists a grid of runs and must not hash every checkpoint."""
    from pretrain.trainer.run_dir import checkpoints, verify

    for number, path in checkpoints(run_dir):
        if number <= iteration:
            return None
        reason = verify(path, checksums=False)
        if reason is not None:
            return f"{path.name} is damaged ({reason})"
    return None


def _state(status: dict | None, iteration: int, train_iters: int | None, stale_after_s: float,
           damaged: str | None = None) -> tuple[str, str]:
    if train_iters is not None and iteration >= train_iters:
        return "finished", ""
    if status is None:
        return "failed", "no status.json and not finished (killed before its first log line, or an old run)"
    state = status.get("state")
    if state == "failed":
        return "failed", status.get("error", "")
    if state == "stopped":
        return "stopped", "saved on a stop signal; waiting for requeue/restart"
    if state == "hung":
        return "hung", status.get("error", "")
    if state == "finished":  # finished by status but its last checkpoint damaged, or removed/pruned by hand
        if damaged:
            return "failed", f"status says finished but its last checkpoint {damaged}"
        return "failed", "status says finished but the last checkpoint is missing"
    if status.get("host") == socket.gethostname():
        if _process_alive(int(status.get("pid", -1))):
            return "running", f"pid {status.get('pid')}"
        return "failed", f"process {status.get('pid')} is gone (killed?) at iteration {status.get('iteration')}"
    age = _age_s(status.get("updated"))
    if age is not None and age <= stale_after_s:
        return "running", f"on {status.get('host')}, last heartbeat {age / 60:.0f} min ago"
    return "failed", f"no heartbeat from {status.get('host')} for {(age or 0) / 3600:.1f} h"


def _without_status(problem: str, run_dir: Path, iteration: int, train_iters: int | None) -> tuple[str, str]:
    """State of a run whose status.json is damaged: from its checkpoints and its run lock, saying so."""
    from pretrain.trainer.metrics import STATUS_FILE

    basis = f"{STATUS_FILE} is damaged ({problem}); state inferred from the checkpoints (newest complete: " \
            f"iteration {iteration} of {train_iters if train_iters is not None else '?'})"
    if train_iters is not None and iteration >= train_iters:
        return "finished", basis
    try:  # the trainer's lock file: "PID <pid> on <host> since <time>"
        pid, host = re.match(r"PID (\d+) on (\S+)", (run_dir / ".lock").read_text()).groups()
    except (OSError, AttributeError):
        return "failed", f"{basis} and the run lock (none): not finished, not running"
    if host == socket.gethostname() and _process_alive(int(pid)):
        return "running", f"{basis} and the run lock (pid {pid} alive)"
    if host != socket.gethostname():
        return "failed", f"{basis}: not finished; cannot tell whether pid {pid} on {host} still runs"
    return "failed", f"{basis} and the run lock (pid {pid} gone): not finished, not running"


def inspect_run(run_dir: Path, root: Path | None = None, stale_after_s: float = STALE_AFTER_S) -> Run:
    """Size, method, seed, iteration and state of one run directory."""
    from pretrain.trainer import config as config_module
    from pretrain.trainer.config_values import load_yaml_text
    from pretrain.trainer.checkpoint import latest_iteration
    from pretrain.trainer.metrics import read_status, status_problem
    from pretrain.trainer.run_commit import last_healthy

    name = str(run_dir.relative_to(root)) if root is not None and run_dir != root else run_dir.name
    iteration = latest_iteration(run_dir) or 0
    status = read_status(run_dir)
    try:
        config = config_module.from_dict(load_yaml_text((run_dir / "config.yaml").read_text(), "config.yaml") or {})
    except (ValueError, TypeError, yaml.YAMLError) as error:
        return Run(run_dir, name, "?", "?", None, iteration, None, "failed", f"config.yaml unreadable: {error}")
    train_iters = config.train_iters()
    problem = status_problem(run_dir)
    damaged = damaged_newest(run_dir, iteration)
    if problem:
        state, detail = _without_status(problem, run_dir, iteration, train_iters)
    else:
        state, detail = _state(status, iteration, train_iters, stale_after_s, damaged)
    if damaged and damaged not in detail:  # a stopped or failed run's newest save, unusable for its resume
        detail = "; ".join(d for d in (detail, f"{damaged}; a resume starts from iteration {iteration}") if d)
    method = method_name(config.positions, config.model.seq_length, config.model)
    healthy = last_healthy(run_dir)
    if healthy is not None:  # pruning keeps it: the checkpoint to restart from after a divergence
        detail += (f"; last healthy checkpoint: iter_{healthy['iteration']:07d} (before the {healthy['trouble']})")
    return Run(run_dir, name, size_name(config.model), method,
               config.seed, iteration, train_iters, state, detail, config)


def discover(root: str | Path, stale_after_s: float = STALE_AFTER_S) -> list[Run]:
    """Every run directory under `root` (or `root` itself), sorted by path."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such directory")
    dirs = sorted({p.parent for p in root.rglob("config.yaml")
                   if not any(part.startswith("iter_") for part in p.parent.relative_to(root).parts)})
    return [inspect_run(d, root, stale_after_s) for d in dirs]
