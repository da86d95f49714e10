"""What a run directory holds and may be trusted for: its layout, checkpoint verification, where to resume, and
which checkpoint a reader gets (writing a checkpoint's files there: run_commit.py; Megatron's state in them:
checkpoint.py).

Layout of a run directory (the lock: run_lock.py):

    <save>/.lock                              POSIX lock held by rank 0 for a run's life (PID, host inside)
    <save>/config.yaml                        resolved config of the run
    <save>/latest_checkpointed_iteration.txt  a hint for Megatron tools; resume trusts the iter_* dirs
    <save>/iter_0000100/                      dist_checkpointing files (model + optimizer),
        rng/rank_00000.pt                     per-rank RNG states as plain tensors (weights_only loads)
        train_state.json                      written last: iteration, consumed samples, scheduler,
                                              layout, config, and "files": bytes + sha256 of every file

A checkpoint directory iter_NNNNNNN is intact when its train_state.json (written last by
`checkpoint.save`) parses and every file it lists has the recorded size (and, when asked,
sha256). Checkpoints saved before that record existed count as intact when train_state.json
and dist_checkpointing's own metadata files are there. `latest_checkpointed_iteration.txt`
is only a hint: resume takes the newest intact iter_* directory and says what it skipped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import torch
import torch.distributed as dist

from pretrain.faults import WRITE_FAULTS, OutputError, naming_output

LATEST = "latest_checkpointed_iteration.txt"
STATE = "train_state.json"
HEALTH = "health.json"  # the last healthy checkpoint: kept by pruning (record_trouble)
WANDB_STATE = Path("wandb", "run.json")  # the run directory's W&B run id and last logged step (tracking.py)
_ITER = re.compile(r"iter_(\d{7})")
FRESH_START = ("pass --set checkpoint.save=<new run dir> to start the run elsewhere, or --set "
               "checkpoint.overwrite=true to delete what is left of the old run and start over in it")
MOVE_RUN = ("move the run directory to a larger disk and pass --set checkpoint.save=<its new path> (or "
            "logging.tensorboard_dir=<elsewhere> for the TensorBoard files)")
log = logging.getLogger("pretrain.checkpoint")
T = TypeVar("T")


class CheckpointError(ValueError):
    """A run directory or checkpoint that cannot be used as asked; the message names it and the fix."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint whose files are missing, truncated or unreadable."""


def iteration_dir(run_dir: Path, iteration: int) -> Path:
    """Directory of one checkpoint."""
    return Path(run_dir) / f"iter_{iteration:07d}"


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank() if dist.is_initialized() else 0


def any_rank(flag: bool) -> bool:
    """Collective: True on every rank when `flag` is True on any (a no-op without a process group)."""
    # NCCL reduces only GPU tensors; gloo (CPU runs) only CPU ones
    value = torch.tensor([1.0 if flag else 0.0], device="cuda" if torch.cuda.is_available() else "cpu")
    if dist.is_initialized():
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(iteration, dir) of every iter_NNNNNNN directory, newest first (not .tmp or .damaged ones)."""
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if (m := _ITER.fullmatch(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def file_record(path: Path) -> dict:
    """{"bytes", "sha256"} of one file, flushed to disk on the way (it is read anyway)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
        os.fsync(handle.fileno())
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def verify(path: str | Path, *, checksums: bool = True) -> str | None:
    """Why the checkpoint at `path` is incomplete or damaged, or None when it is intact."""
    path = Path(path)
    try:
        record = json.loads((path / STATE).read_text())
    except FileNotFoundError:
        return f"{STATE} is missing (the save never finished, or files were removed)"
    except (OSError, ValueError):
        return f"{STATE} is not valid JSON"
    if not isinstance(record, dict) or not isinstance(record.get("iteration"), int):
        return f"{STATE} holds no iteration number"
    files = record.get("files")
    if files is None:  # saved before completeness records: dist_checkpointing's own files at least
        missing = [n for n in ("metadata.json", ".metadata") if not (path / n).is_file()]
        if missing:
            return f"{missing[0]} is missing"
        try:  # megatron-core 0.16 writes common.pt and names its backend here; 0.19 keeps that state in .distcp
            names_common = "common_backend" in json.loads((path / "metadata.json").read_text())
        except (OSError, ValueError, TypeError):
            return "metadata.json is not valid JSON"
        return "common.pt is missing" if names_common and not (path / "common.pt").is_file() else None
    try:
        for name, expected in files.items():
            file = path / name
            if not file.is_file():
                return f"{name} is missing"
            size = file.stat().st_size
            if size != expected["bytes"]:
                return f"{name} has {size} of its {expected['bytes']} bytes (truncated or overwritten)"
            if checksums and file_record(file)["sha256"] != expected["sha256"]:
                return f"{name} does not match its sha256 checksum"
    except (AttributeError, KeyError, TypeError):
        return f"{STATE} has a malformed \"files\" record"
    return None


def _marker(run_dir: Path) -> tuple[int | None, str | None]:
    """(iteration named by the marker, what is wrong with it)."""
    marker = run_dir / LATEST
    if not marker.is_file():
        return None, f"{LATEST} is missing"
    text = marker.read_text(errors="replace").strip()
    if not text.isdigit():
        return None, f"{LATEST} is {'empty' if not text else f'not an iteration number ({text[:20]!r})'}"
    return int(text), None


@dataclass
class Resume:
    """Where a run continues: intact checkpoints newest first (none: start fresh) and what was skipped."""

    candidates: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def plan_resume(run_dir: str | Path, *, overwrite: bool = False) -> Resume:
    """The intact checkpoints a run in `run_dir` may resume from, newest first. A directory with traces of
    a run (iter_* dirs, a marker) but nothing intact is refused, or with `overwrite` cleared for a new run.

    `overwrite` never touches an intact checkpoint: a requeued job started with it still resumes."""
    run_dir = Path(run_dir)
    found = checkpoints(run_dir)
    named, marker_problem = _marker(run_dir)
    has_marker = (run_dir / LATEST).exists()
    resume, damaged = Resume(), []
    for _, path in found:
        reason = verified(path)
        if reason is None:
            resume.candidates.append(path)
        else:
            damaged.append(f"{path.name}: {reason}")
            resume.notes.append(f"skipping {path}: {reason}")
    if resume.candidates:
        newest = int(_ITER.fullmatch(resume.candidates[0].name).group(1))
        if marker_problem:
            resume.notes.append(f"{marker_problem}; using the newest intact checkpoint instead")
        elif named != newest:
            resume.notes.append(f"{LATEST} names iteration {named}; the newest intact checkpoint is {newest}")
        return resume
    if (damaged or has_marker) and overwrite:
        with run_output(run_dir, run_dir, "checkpoint.overwrite=true, deleting the previous run"):
            for _, path in found:
                shutil.rmtree(path)
            (run_dir / LATEST).unlink(missing_ok=True)
        shutil.rmtree(run_dir / "tensorboard", ignore_errors=True)
        # a new W&B run too (tracking.py); the old run's offline files stay for `wandb sync`
        (run_dir / WANDB_STATE).unlink(missing_ok=True)
        return Resume(notes=[f"checkpoint.overwrite=true: deleted the damaged checkpoints "
                             f"({', '.join(p.name for _, p in found) or 'none'}), {LATEST} and TensorBoard "
                             f"events of the previous run in {run_dir}; starting a new run (and a new W&B run)"])
    if damaged:
        raise CheckpointError(f"run directory {run_dir} holds no intact checkpoint ({'; '.join(damaged)}); "
                              f"{FRESH_START}")
    if has_marker:
        what = marker_problem or f"{LATEST} names iteration {named}"
        raise CheckpointError(f"run directory {run_dir}: {what} but no iter_* checkpoint exists (removed, or "
                              f"never finished); {FRESH_START}")
    return resume


def set_aside_newer(run_dir: str | Path, iteration: int) -> list[str]:
    """Rename iter_* newer than the resumed `iteration` (damaged or unloadable) to iter_N.damaged: the
    resumed run will write those iterations again, and nothing of a run is deleted without being asked."""
    notes = []
    for number, path in checkpoints(Path(run_dir)):
        if number > iteration:
            target, n = path.with_name(f"{path.name}.damaged"), 1
            while target.exists():
                target, n = path.with_name(f"{path.name}.damaged{n}"), n + 1
            with run_output(run_dir, path, f"setting the damaged {path.name} aside"):
                os.replace(path, target)
            notes.append(f"moved the damaged {path.name} to {target.name} (delete it when no longer needed)")
    return notes


def resume_hint(run_dir: str | Path) -> str:
    """How a run continues once its disk is fixed: from its newest complete checkpoint, or from the start."""
    latest = latest_iteration(run_dir)
    if latest is None:
        return "rerun the same command (no checkpoint was completed yet: the run starts from the beginning)"
    return (f"rerun the same command to resume from iteration {latest} "
            f"({iteration_dir(Path(run_dir), latest).name}, the newest complete checkpoint)")


@contextmanager
def run_output(run_dir: str | Path, path: str | Path, what: str, elsewhere: str = MOVE_RUN,
               faults: frozenset[int] = WRITE_FAULTS) -> Iterator[None]:
    """A write fault (full disk, read-only or removed directory) inside the block becomes one OutputError
    naming `what` at `path`, the fix and where the run resumes. Every writer of a training run uses it:
    run lock, config.yaml, status.json, checkpoints, TensorBoard and W&B files."""
    with naming_output(path, what=what, elsewhere=elsewhere, then=lambda: resume_hint(run_dir), faults=faults):
        yield


def latest_iteration(run_dir: str | Path) -> int | None:
    """Iteration of the newest intact checkpoint in `run_dir` (sizes checked, not checksums), or None."""
    for iteration, path in checkpoints(Path(run_dir)):
        if verify(path, checksums=False) is None:
            return iteration
    return None


_warned: set[str] = set()
_intact: dict[str, tuple[int, int, int]] = {}  # checkpoint dir -> its train_state.json's stat when it verified


def verified(path: str | Path) -> str | None:
    """verify(path) with checksums, as resume does, remembered in this process while the checkpoint's
    train_state.json is unchanged: a reader resolves one checkpoint several times, and hashing a large one
    takes minutes."""
    path = Path(path)
    try:
        stat = (path / STATE).stat()
        key = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
    except OSError:
        key = None
    if key is not None and _intact.get(str(path)) == key:
        return None
    reason = verify(path, checksums=True)
    if reason is None and key is not None:
        _intact[str(path)] = key
    return reason


def resolve(path: str | Path) -> Path:
    """The one resolution of a checkpoint for every reader (resume, checkpoint.load, eval, export-hf, the task
    suite, selfcheck): from a run directory its newest intact checkpoint (sizes and sha256 checksums as recorded
    in train_state.json), saying in one warning which damaged ones it skipped; an iter_* directory as named,
    refused (DamagedCheckpointError naming the file) when damaged."""
    path = Path(path)
    if (path / STATE).exists() or _ITER.fullmatch(path.name):
        reason = verified(path)
        if reason:
            intact = next((c for _, c in checkpoints(path.parent) if c != path and verified(c) is None), None)
            instead = f" ({intact} is intact)" if intact is not None else ""
            raise DamagedCheckpointError(f"checkpoint {path} is damaged: {reason}; pass an intact iter_* "
                                         f"directory{instead}, or the run directory to use its newest intact "
                                         "checkpoint")
        return path
    damaged = []
    for _, candidate in checkpoints(path):
        reason = verified(candidate)
        if reason is None:
            note = f"skipping the damaged {'; '.join(damaged)}; using {candidate}"
            if damaged and note not in _warned:
                _warned.add(note)
                log.warning(note)
            return candidate
        damaged.append(f"{candidate.name} ({reason})")
    if damaged:
        raise DamagedCheckpointError(f"{path} holds no intact checkpoint ({'; '.join(damaged)}); "
                                     "pass a run directory or iter_* directory with an intact checkpoint")
    if (path / LATEST).exists():
        raise DamagedCheckpointError(f"{path} has a {LATEST} but no iter_* checkpoint (removed, or never "
                                     "finished); pass a run directory that holds one")
    raise FileNotFoundError(f"{path} holds no checkpoint (no iter_* directory and no {STATE}); "
                            "pass a run directory written by `python -m pretrain train` or one of its iter_* dirs")


def read_train_state(checkpoint: str | Path) -> dict:
    """The JSON side of a checkpoint: iteration, consumed samples, scheduler, layout, config."""
    return json.loads((resolve(checkpoint) / STATE).read_text())


def on_rank0(function: Callable[[], T]) -> T:
    """Collective: run `function` on rank 0 alone; every rank returns its result or raises its CheckpointError
    (an OutputError of rank 0 becomes a CheckpointError with the same message)."""
    outcome: list = [None, None]
    if rank() == 0:
        try:
            outcome = [function(), None]
        except (CheckpointError, OutputError) as error:
            outcome = [None, str(error)]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(outcome, src=0)
    if outcome[1] is not None:
        raise CheckpointError(outcome[1])
    return outcome[0]
