"""The run directory's lock: one training run at a time in a run directory, released by the kernel at death."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from pathlib import Path

from pretrain.trainer.run_dir import CheckpointError, run_output


class RunLock:
    """Exclusive POSIX record lock on <run dir>/.lock, held by rank 0 for a training run's life.

    The kernel releases it when the process dies, so a killed run never leaves a stale lock. A POSIX
    lock (fcntl/lockf), not flock: a flock belongs to the open file, which forked children (Megatron's
    checkpoint writers) inherit, so a writer outliving a killed trainer kept the run locked; a POSIX
    lock belongs to the process and is not inherited. Its catch: closing *any* descriptor of the file
    in the holding process drops it, so nothing else in a trainer opens `.lock`. Across nodes it needs
    a file system with POSIX locks (NFS with lockd/NFSv4, Lustre mounted with -o flock)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / ".lock"
        self._handle = None

    def acquire(self) -> None:
        """Take the lock, or raise CheckpointError naming the PID and host holding it."""
        with run_output(self.path.parent, self.path, "run lock"):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = os.fdopen(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644), "r+")
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as busy:
            if busy.errno not in (errno.EACCES, errno.EAGAIN):
                handle.close()
                raise
            holder = handle.read().strip() or "a process that has not written its PID yet"
            handle.close()
            raise CheckpointError(f"run directory {self.path.parent} is in use by another training run ({holder}); "
                                  "wait for it to finish, or pass --set checkpoint.save=<another run dir>") from None
        self._handle = handle  # held (and released) even when the PID line below cannot be written
        with run_output(self.path.parent, self.path, "run lock"):
            handle.truncate(0)
            handle.write(f"PID {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            handle.flush()

    def release(self) -> None:
        """Drop the lock (the file stays: unlinking it would race with a run about to lock it)."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            try:
                handle.close()
            except OSError:  # the PID line's flush on a full disk; the kernel drops the lock anyway
                pass
