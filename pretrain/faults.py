"""Errors that reach the user as one line naming the input (or output) and the fix: the write-fault room.

Writing faults (a full disk, a read-only or unwritable directory, a directory removed under a
running job) are turned into our one-line OutputError here, in one place, for every writer of
the project: data_prep's shards, the trainer's checkpoints, status.json, TensorBoard (and any
other metrics writer), evaluation records, and the Hugging Face export and import.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Union

# A full disk, an exhausted quota and a file-size limit (RLIMIT_FSIZE with SIGXFSZ ignored) all
# mean the same to the user: this output path cannot grow.
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_NOT_WRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM}
_REMOVED = {errno.ENOENT, errno.ESTALE}
_TOO_LONG = {errno.ENAMETOOLONG}
WRITE_FAULTS = frozenset(_NO_SPACE | _NOT_WRITABLE | _REMOVED | _TOO_LONG)
# a block that also reads inputs: a missing file there is a missing input, not a removed output
FULL_OR_READ_ONLY = frozenset(_NO_SPACE | _NOT_WRITABLE)
# "[Errno 28]" from Python, "(os error 28)" / "Os { code: 28" from Rust libraries (safetensors, tokenizers)
_ERRNO_TEXT = re.compile(r"\[Errno (\d+)\]|\(os error (\d+)\)|Os \{ code: (\d+)")

DEFAULT_ELSEWHERE = "pass a --data-prefix on a larger disk"
DEFAULT_THEN = "rerun the same command (finished work is kept and resumed)"
Then = Union[str, Callable[[], str]]  # how to continue; a callable is asked only once the fault happened


class DataError(RuntimeError):
    """Bad input under --strict, or an unusable configuration."""


class OutputError(DataError):
    """An output could not be written: its disk is full, its directory read-only, or removed while running."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.errno = code

    def __reduce__(self):  # crosses process boundaries (data_prep workers) with its errno
        return type(self), (str(self), self.errno)


class OutputSpaceError(OutputError):
    """An output could not be written because its filesystem (or a size limit) is full."""


def write_fault(error: BaseException | None) -> int | None:
    """The errno of the write fault behind `error`, or None when it is another kind of error.

    Follows __cause__/__context__ and the per-rank failures of torch.distributed.checkpoint's
    CheckpointException; a failure that crossed a process boundary (Megatron's checkpoint
    writer workers) keeps only the text "[Errno 28] ...", which is read too."""
    seen: set[int] = set()
    pending = [error]
    while pending:
        item = pending.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        if getattr(item, "errno", None) in WRITE_FAULTS:  # OSError, OutputError, CheckpointSaveError
            return item.errno
        try:
            match = _ERRNO_TEXT.search(str(item))
        except Exception:  # noqa: BLE001 (a library __str__ that fails must not hide the original error)
            match = None
        code = int(next(g for g in match.groups() if g)) if match else None
        if code in WRITE_FAULTS:
            return code
        failures = getattr(item, "failures", None)  # CheckpointException: {rank: (exception, traceback)}
        if isinstance(failures, dict):
            for failure in failures.values():
                pending.extend(x for x in (failure if isinstance(failure, tuple) else (failure,))
                               if isinstance(x, BaseException))
        pending.extend([item.__cause__, item.__context__])
    return None


def probe_fault(path: str | os.PathLike, full_below: int = 1 << 20) -> int | None:
    """Why writing under `path` fails now, for an error that did not say (torch's zip writer reports a full
    disk as "unexpected pos 704 vs 598"): ENOENT, EROFS, EACCES or ENOSPC, else None."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        return errno.ENOENT
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    if stat.f_flag & os.ST_RDONLY:
        return errno.EROFS
    if not os.access(path, os.W_OK):
        return errno.EACCES
    return errno.ENOSPC if stat.f_bavail * stat.f_frsize < full_below else None


def human_bytes(n: float) -> str:
    """'2.4 MB' (decimal units, as df -H and the progress bars)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def existing_parent(path: str | os.PathLike) -> str:
    """The nearest directory at or above `path` that exists (where a disk can be asked for free space)."""
    where = os.path.abspath(path)
    while not os.path.isdir(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    return where


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free bytes on the filesystem holding `path` (or its nearest existing parent), None if unknown."""
    try:
        return shutil.disk_usage(existing_parent(path)).free
    except OSError:
        return None


def space_picture(needed: str | None, written: int, removed: bool, free: int | None) -> str:
    """'needs about 2.4 MB; 1.1 MB free', or where the size needed is unknown, what was written and what is free,
    e.g. 'size needed unknown: 41.0 kB written before the failure, removed since; 41.0 kB free now'.

    "needs more than the 41.0 kB written; 41.0 kB free" read as if the output fitted: the free space is measured
    after the partial file was removed, so it includes what was written. Only a known size is called a need."""
    free_text = f"{human_bytes(free)} free" if free is not None else ""
    if needed:
        return "; ".join(s for s in (f"needs {needed}", free_text) if s)
    if written:
        wrote = f"size needed unknown: {human_bytes(written)} written before the failure" + (
            ", removed since" if removed else "")
        return "; ".join(s for s in (wrote, f"{free_text} now" if free_text else "") if s)
    return free_text


def _elsewhere_for(code: int, elsewhere: str) -> str:
    """The callers' "... on a larger disk" fix, worded for the fault: more room helps a full disk only."""
    if code in _NOT_WRITABLE:
        return elsewhere.replace("larger disk", "writable disk")
    if code in _REMOVED:
        return elsewhere.replace("larger disk", "disk that stays mounted")
    if code in _TOO_LONG:
        return elsewhere.replace("a larger disk", "a shorter path")
    return elsewhere


def output_error(code: int, path: str | os.PathLike, *, what: str = "", needed: str | None = None,
                 done: str = "", elsewhere: str = DEFAULT_ELSEWHERE, then: Then = DEFAULT_THEN,
                 written: int = 0, removed: bool = False) -> OutputError:
    """Our one-line error for write fault `code` on `path`: what failed, the space picture, and the fix.

    `what` names the output ("checkpoint 4"), `needed` the space it takes ("about 2.4 MB") where known, else
    `written` the bytes written before the failure (`removed`: deleted again since), `done` what was cleaned up or
    kept, `elsewhere` the option that moves it to another disk, `then` how to continue afterwards."""
    path, then = str(path), then if isinstance(then, str) else then()
    elsewhere = _elsewhere_for(code, elsewhere)
    done = f"; {done}" if done else ""
    where = os.path.dirname(os.path.abspath(path))
    prefix = f"{what} ({path})" if what else path
    if code in _NO_SPACE:
        space = space_picture(needed, written, removed, free_bytes(path))
        return OutputSpaceError(
            f"{prefix}: {os.strerror(code)} while writing{f' ({space})' if space else ''}{done}; fix: free space in "
            f"{existing_parent(where)} (or raise the quota / file-size limit), or {elsewhere}, then {then}", code)
    if code in _TOO_LONG:
        longest = max(Path(path).parts, key=lambda part: len(os.fsencode(part)), default="")
        return OutputError(f"{prefix[:200]}: a name in the path is {len(os.fsencode(longest))} bytes, longer than the "
                           f"filesystem allows (255){done}; fix: shorten it, or {elsewhere}, then {then}", code)
    if code in _NOT_WRITABLE:
        return OutputError(f"{prefix}: {os.strerror(code)} while writing{done}; fix: make {existing_parent(where)} "
                           f"writable (remount it read-write, or fix its permissions), or {elsewhere}, then {then}",
                           code)
    return OutputError(f"{prefix}: {os.strerror(code)} while writing ({where} was removed while the command ran, "
                       f"or never existed){done}; fix: keep {where} in place (an unmounted or cleaned-up disk?), or "
                       f"{elsewhere}, then {then}", code)


@contextmanager
def naming_output(path: str | os.PathLike, *, what: str = "", needed: str | None = None,
                  elsewhere: str = DEFAULT_ELSEWHERE, then: Then = DEFAULT_THEN,
                  faults: frozenset[int] = WRITE_FAULTS, partial: tuple[str, ...] = (),
                  done: str = "") -> Iterator[None]:
    """Turn a write fault raised inside the block into an OutputError naming `path` and the fix.

    Write errors rarely carry a filename (write() and close() do not), so without this the user
    sees "[Errno 28] No space left on device" and no idea which of several disks filled up.
    `faults` narrows the errnos explained (FULL_OR_READ_ONLY where the block also reads inputs);
    the `partial` files the block writes are removed when it fails, whatever the error (`done` says
    what the caller cleans up itself).
    """
    try:
        yield
    except Exception as error:
        written = sum(os.path.getsize(p) for p in partial if os.path.isfile(p))
        removed = [os.path.basename(p) for p in partial if _remove(p)]
        code = write_fault(error)
        if isinstance(error, OutputError) or code not in faults:
            raise
        done = f"removed the partial {', '.join(removed)}" if removed else done
        # a named output is told by the path the user gave; an unnamed one by the file that failed
        where = path if what else getattr(error, "filename", None) or path
        raise output_error(code, where, what=what, needed=needed, done=done, elsewhere=elsewhere, then=then,
                           written=written, removed=bool(removed)) from None


def write_text_atomic(path: str | os.PathLike, text: str, *, what: str = "", elsewhere: str = DEFAULT_ELSEWHERE,
                      then: Then = DEFAULT_THEN) -> None:
    """Write `text` to `path` (parents created) through a temporary file renamed into place: a write fault
    leaves the previous file (or none) and no temporary file, and raises our one-line OutputError."""
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with naming_output(path, what=what, elsewhere=elsewhere, then=then, partial=(tmp,)):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(tmp, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)


def check_writable(directory: str | os.PathLike, *, what: str = "", elsewhere: str = DEFAULT_ELSEWHERE,
                   then: Then = DEFAULT_THEN) -> None:
    """Create `directory` and a probe file in it, before long work whose result goes there: a read-only,
    removed or completely full disk is reported now rather than after hours of computing."""
    directory = os.fspath(directory)
    probe = os.path.join(directory, f".write-probe-{os.getpid()}")
    with naming_output(directory, what=what, elsewhere=elsewhere, then=then, partial=(probe,)):
        os.makedirs(directory, exist_ok=True)
        with open(probe, "wb") as handle:
            handle.write(b"\0" * 4096)
            handle.flush()
            os.fsync(handle.fileno())
        os.unlink(probe)


def _remove(path: str) -> bool:
    """Delete a temporary file if it is there; True when it was."""
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def one_line(message: str) -> str:
    """`message` with newlines folded, so a library's multi-line error stays one line."""
    return " ".join(message.split())
