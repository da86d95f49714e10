"""An exclusive lock on a file, held by one process and released by the kernel when it dies: the trainer's run
lock (pretrain/trainer/run_lock.py) and data_prep build's lock on its prefix.

A POSIX record lock (fcntl/lockf), not flock: a flock belongs to the open file, which forked children inherit, so a
child outliving a killed holder kept it locked; a POSIX lock belongs to the process and is not inherited. Its catch:
closing *any* descriptor of the file in the holding process drops it, so a holder never opens its lock file twice.
A dead holder's lock is gone with it (the kernel drops it): its PID line left in the file is overwritten by the
next holder, so no stale lock ever needs cleaning. Across nodes it needs a file system with POSIX locks (NFS with
lockd/NFSv4, Lustre mounted with -o flock).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from typing import IO, Optional


def open_lock_file(path: str | os.PathLike) -> IO[str]:
    """The lock file opened for reading and writing, created if missing."""
    return os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "r+")


def lock_or_holder(handle: IO[str]) -> Optional[str]:
    """Take the exclusive lock of an open lock file: None when taken, else the holder's line (and `handle` closed)."""
    try:
        fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as busy:
        if busy.errno not in (errno.EACCES, errno.EAGAIN):
            handle.close()
            raise
        holder = handle.read().strip() or "a process that has not written its PID yet"
        handle.close()
        return holder
    return None


def write_holder(handle: IO[str]) -> None:
    """Write this process's PID, host and start time into a lock file it holds (what a refused process prints)."""
    handle.truncate(0)
    handle.seek(0)
    handle.write(f"PID {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    handle.flush()


class FileLock:
    """An exclusive lock on `path` for a block of work: `acquire` returns None when held, else the holder's line."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = path
        self._handle: Optional[IO[str]] = None

    def acquire(self) -> Optional[str]:
        """Take the lock and write this process into it; None on success, else who holds it."""
        handle = open_lock_file(self.path)
        holder = lock_or_holder(handle)
        if holder is None:
            self._handle = handle
            write_holder(handle)
        return holder

    def release(self) -> None:
        """Drop the lock (the file stays: unlinking it would race with a process about to lock it)."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            try:
                handle.close()
            except OSError:  # the PID line's flush on a full disk; the kernel drops the lock anyway
                pass
