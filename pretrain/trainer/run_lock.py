"""The run directory's lock: one training run at a time in a run directory, released by the kernel at death."""

from __future__ import annotations

from pathlib import Path

from pretrain.locks import lock_or_holder, open_lock_file, write_holder
from pretrain.trainer.run_dir import CheckpointError, run_output


class RunLock:
    """Exclusive POSIX record lock on <run dir>/.lock, held by rank 0 for a training run's life.

    The kernel releases it when the process dies, so a killed run never leaves a stale lock. A POSIX
    lock (pretrain/locks.py says why not flock: Megatron's forked checkpoint writers would inherit
    one); closing *any* descriptor of the file in the holding process drops it, so nothing else in a
    trainer opens `.lock`."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / ".lock"
        self._handle = None

    def acquire(self) -> None:
        """Take the lock, or raise CheckpointError naming the PID and host holding it."""
        with run_output(self.path.parent, self.path, "run lock"):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = open_lock_file(self.path)
        holder = lock_or_holder(handle)
        if holder is not None:
            raise CheckpointError(f"run directory {self.path.parent} is in use by another training run ({holder}); "
                                  "wait for it to finish, or pass --set checkpoint.save=<another run dir>") from None
        self._handle = handle  # held (and released) even when the PID line below cannot be written
        with run_output(self.path.parent, self.path, "run lock"):
            write_holder(handle)

    def release(self) -> None:
        """Drop the lock (the file stays: unlinking it would race with a run about to lock it)."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            try:
                handle.close()
            except OSError:  # the PID line's flush on a full disk; the kernel drops the lock anyway
                pass
