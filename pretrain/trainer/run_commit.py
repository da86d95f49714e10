"""Writing a checkpoint's files into the run directory (layout and what may be trusted: run_dir.py): the partial
iter_N.tmp directory, the commit (train_state.json written last, then the rename and the LATEST hint), pruning that
keeps the last healthy checkpoint (health.json, marked at a skipped update or loss spike), and a failed save's
clean-up with its one-line error.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import suppress
from pathlib import Path

from pretrain.faults import OutputError, human_bytes, output_error
from pretrain.trainer.run_dir import (HEALTH, LATEST, MOVE_RUN, STATE, checkpoints, iteration_dir, latest_iteration,
                                      rank, resume_hint, run_output, verify)


def partial_dir(run_dir: Path, iteration: int) -> Path:
    """Where checkpoint `iteration` is written before its commit (a crash leaves only this behind)."""
    return Path(f"{iteration_dir(run_dir, iteration)}.tmp")


def start_partial(run_dir: Path, iteration: int, *, make_run_dir: bool) -> None:
    """An empty partial directory for checkpoint `iteration` (what an earlier crash left there is removed)."""
    tmp = partial_dir(run_dir, iteration)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=make_run_dir)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(path: Path, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def commit_checkpoint(run_dir: Path, iteration: int, record: dict, keep_last: int) -> None:
    """Write train_state.json into the partial directory, rename it to iter_N (the commit point: an iter_*
    directory is complete by construction), update the LATEST hint and keep the newest `keep_last`."""
    tmp = partial_dir(run_dir, iteration)
    _write_durably(tmp / STATE, json.dumps(record, indent=1, default=str))
    os.replace(tmp, iteration_dir(run_dir, iteration))
    _fsync_dir(run_dir)
    marker_tmp = run_dir / f"{LATEST}.tmp"
    _write_durably(marker_tmp, str(iteration))
    os.replace(marker_tmp, run_dir / LATEST)
    _fsync_dir(run_dir)
    _prune(run_dir, keep_last)


def failed_save_error(run_dir: Path, iteration: int, code: int) -> OutputError:
    """Remove what a failed save left and describe it: space needed vs free, the newest complete checkpoint."""
    tmp = partial_dir(run_dir, iteration)
    existed = tmp.is_dir()
    written = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file()) if existed else 0
    shutil.rmtree(tmp, ignore_errors=True)
    with suppress(OSError):  # a read-only directory keeps what it has
        (run_dir / f"{LATEST}.tmp").unlink(missing_ok=True)
    latest = latest_iteration(run_dir)
    removed = (f"removed the partial {tmp.name}" if not tmp.exists() else f"could not remove {tmp}") if existed else ""
    if latest is not None and latest != iteration:
        try:
            size = sum(f["bytes"] for f in json.loads((iteration_dir(run_dir, latest) / STATE).read_text())["files"]
                       .values())
            needed = f"about {human_bytes(size)}, the size of iteration {latest}'s checkpoint"
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            needed = None
        kept = f"{iteration_dir(run_dir, latest).name} is still the newest complete checkpoint"
    else:
        needed, kept = None, "no earlier checkpoint exists" if latest is None else ""
    return output_error(code, iteration_dir(run_dir, iteration), what=f"checkpoint {iteration}", needed=needed,
                        done=", ".join(x for x in (removed, kept) if x), elsewhere=MOVE_RUN,
                        then=resume_hint(run_dir), written=written, removed=existed and not tmp.exists())


def remove_partials(run_dir: Path) -> list[str]:
    """Remove every uncommitted iter_N.tmp of `run_dir` (an abandoned or crashed save); the names removed."""
    removed = []
    for stale in sorted(Path(run_dir).glob("iter_*.tmp")):
        shutil.rmtree(stale, ignore_errors=True)
        if not stale.exists():
            removed.append(stale.name)
    return removed


def _prune(run_dir: Path, keep_last: int) -> None:
    remove_partials(run_dir)
    healthy = last_healthy(run_dir)
    for iteration, old in checkpoints(run_dir)[keep_last:]:
        if iteration != (healthy or {}).get("iteration"):  # kept beside the newer ones, never instead of them
            shutil.rmtree(old, ignore_errors=True)


def record_trouble(run_dir: Path, step: int, what: str) -> None:
    """Rank 0, at the first skipped update or loss spike after a healthy step: the newest checkpoint saved
    before `step` becomes the last healthy one, which pruning keeps (`runs` shows it)."""
    if rank() != 0:
        return
    before = next((n for n, path in checkpoints(run_dir) if n < step and verify(path, checksums=False) is None), None)
    if before is None:
        return
    with run_output(run_dir, run_dir / HEALTH, "the record of the last healthy checkpoint"):
        _write_durably(run_dir / HEALTH, json.dumps({"iteration": before, "step": step, "trouble": what}))


def last_healthy(run_dir: str | Path) -> dict | None:
    """{"iteration", "step", "trouble"}: the newest checkpoint saved before the latest trouble, or None."""
    try:
        record = json.loads((Path(run_dir) / HEALTH).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("iteration"), int) else None
