"""The trainer's helper processes: shielded from the job's stop signals, and never outliving the trainer.

SLURM (and a terminal's Ctrl-C) signal every process of a job step, not only the trainer. The
trainer turns SIGTERM/SIGUSR1/SIGINT into "save and exit 75"; its helpers must neither die of those
signals in the middle of that save nor outlive a trainer killed with SIGKILL (they would hold the
run's memory, and, before the run lock became a POSIX lock, the lock itself):

- forked children (Megatron's checkpoint writers, data workers) get PR_SET_PDEATHSIG=SIGKILL from an
  at-fork hook, so the kernel kills them when the trainer dies. Only megatron-core 0.16 forks checkpoint
  writers (FileSystemWriterAsync.write_preloaded_data_multiproc); 0.17.1, 0.18.2 and 0.19.2 write in the
  trainer's own threads (write_preloaded_data_multithread), where the results-queue server below is the one
  checkpoint helper process;
- Megatron's results-queue Manager server (spawned where CUDA is initialised, as Megatron does; forked on
  CPU runs, see `manager_start_method`) sets the same in its initializer and is born with the stop signals
  blocked (it ignores SIGINT itself);
- multiprocessing's resource tracker is started first, inside the same shield: its start-up
  *unblocks* SIGINT/SIGTERM in the caller (it restores with SIG_UNBLOCK, not the previous mask),
  which is how the Manager used to be born with only SIGUSR1 blocked and died on SIGTERM. The
  tracker ignores SIGINT/SIGTERM itself and exits when the last holder of its pipe is gone.

Reaches into Megatron-Core internals (checked against megatron-core 0.16.1, 0.17.1, 0.18.2 and 0.19.2):
- dist_checkpointing.strategies.filesystem_async._results_queue, the module global behind
  (_)get_write_results_queue (same name and meaning in all four): set here to a Manager queue whose
  server dies with the trainer; Megatron creates it lazily only while it is None.

This module imports only the standard library: a spawned Manager server imports it to run
`die_with_parent`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from contextlib import contextmanager
from typing import Iterator

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGUSR1, signal.SIGINT})
_PR_SET_PDEATHSIG = 1
_hook_installed = False
_manager = None  # the results queue's Manager: kept referenced so its server lives as long as the trainer


def die_with_parent(parent_pid: int | None = None) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    expected = parent_pid if parent_pid is not None else _parent_at_fork
    if expected is not None and os.getppid() != expected:  # the parent died before prctl took effect
        os._exit(1)


_parent_at_fork: int | None = None


def _before_fork() -> None:
    global _parent_at_fork
    _parent_at_fork = os.getpid()


def install_fork_hook() -> None:
    """From now on every child forked by this process (not exec'ed subprocesses) dies with it."""
    global _hook_installed
    if not _hook_installed:
        os.register_at_fork(before=_before_fork, after_in_child=die_with_parent)
        _hook_installed = True


@contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Children started inside are born with SIGTERM/SIGUSR1/SIGINT blocked (the mask is inherited)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def manager_start_method() -> str:
    """How the results queue's server starts: "spawn" once CUDA is initialised (Megatron's choice), else "fork".

    A spawned server is a fresh interpreter that imports torch again to unpickle the write results it
    holds: ~3.5 CPU-s and ~5 s of wall clock per training process on 2 cores (a tiny 3-step run took 19 s
    spawned, 13 s forked). Forking a process without a CUDA context is safe, and the checkpoint writers
    are forked from this same process anyway.
    The environment's PRETRAIN_HELPER_START=spawn|fork overrides the choice: the stop-signal tests start the
    server as GPU nodes do on a CPU machine, where a forked one would inherit the trainer's handlers and hide
    a missing shield.
    """
    forced = os.environ.get("PRETRAIN_HELPER_START")
    if forced in ("spawn", "fork"):
        return forced
    torch = sys.modules.get("torch")
    return "spawn" if torch is not None and torch.cuda.is_initialized() else "fork"


def start_checkpoint_helpers() -> None:
    """Start the resource tracker and Megatron's checkpoint results queue, shielded and tied to this process."""
    global _manager
    import multiprocessing
    from multiprocessing import resource_tracker
    from multiprocessing.managers import SyncManager

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if not hasattr(filesystem_async, "_results_queue"):  # renamed in some future version: its own start, shielded
        from megatron_ext.versions import find

        found = find("write_results_queue")
        with stop_signals_blocked():
            resource_tracker.ensure_running()
        with stop_signals_blocked():
            if found is not None:
                found[1]()
        return
    if filesystem_async._results_queue is not None:
        return
    with stop_signals_blocked():
        resource_tracker.ensure_running()  # first: it unblocks SIGINT/SIGTERM on its way out (see the top)
    with stop_signals_blocked():
        _manager = SyncManager(ctx=multiprocessing.get_context(manager_start_method()))
        _manager.start(initializer=die_with_parent, initargs=(os.getpid(),))
        filesystem_async._results_queue = _manager.Queue()
