"""Straggler and stall report: every `logging.straggler_interval` steps the ranks gather their step times.

A rank's own time is the step's wall time minus the time it spent blocked in communication with its peers, so
a rank that waits for a slow peer does not look slow itself, whichever group the two share:
- data parallel: Megatron's gradient synchronisation (`finalize_model_grads`: the all-reduce or reduce-scatter,
  the embedding and layer-norm grad all-reduces);
- pipeline parallel: every send and receive of the schedule (`P2PCommunicator._communicate`, which waits for its
  requests), so a stage's wait for a slow neighbour, and the pipeline bubble, are not its own time;
- tensor parallel: the collectives of Megatron's TP regions (the forward and backward all-reduces, all-gathers
  and reduce-scatters of `tensor_parallel.mappings`).
Only the outermost of nested timed calls counts. What is left unexcluded: the vocab-parallel cross entropy's
three small all-reduces, the loss all-reduce, and the overlapped p2p of the interleaved schedule, whose requests are
waited on in the schedule itself. With NCCL these calls return once their kernels are queued, so on GPUs a wait
for a peer lands at the next host sync, inside a rank's own time: the report is exact on gloo, a hint on NCCL.

Rank 0 prints the slowest rank and its ratio to the median when the ratio reaches
`logging.straggler_threshold`, and every stall a rank's watchdog saw (its thread could not run: the process
was stopped or starved; watchdog.py) with the step it hit; TensorBoard gets perf/straggler_ratio,
perf/slowest_rank and perf/longest_stall_s at every gather. The first step after a start or resume is start-up
(allocations, first loads), not a rank's pace: it is left out of the first window.
"""

from __future__ import annotations

# Reaches into library internals (checked against megatron-core 0.16.1):
# - megatron.core.pipeline_parallel.p2p_communication.P2PCommunicator._communicate: the one method every
#   pipeline send and receive goes through, wrapped to time it.
# - megatron.core.tensor_parallel.mappings._reduce, _gather_along_first_dim, _gather_along_last_dim,
#   _reduce_scatter_along_first_dim, _reduce_scatter_along_last_dim: the collectives behind every TP region
#   (called by module-global name from the region's autograd functions, so replacing them there covers all).
# Not in megatron_ext.versions.REACHES (selfcheck) yet: a missing name is skipped, and the report is then less exact.

import functools
import socket
import statistics
import threading
import time
from typing import Callable

import torch.distributed as dist

_TP_COLLECTIVES = ("_reduce", "_gather_along_first_dim", "_gather_along_last_dim", "_reduce_scatter_along_first_dim",
                   "_reduce_scatter_along_last_dim")


class _Blocked(threading.local):
    depth = 0  # per thread: the backward of a TP region may run on autograd's device thread


_nesting = _Blocked()
_blocked_s = [0.0]  # seconds in timed communication, all threads of this process


def timed_communication(function: Callable) -> Callable:
    """`function`, its time added to this process's blocked seconds unless a timed call encloses it."""
    if getattr(function, "_posaug_timed", False):
        return function

    @functools.wraps(function)
    def timed(*args, **kwargs):
        if _nesting.depth:
            return function(*args, **kwargs)
        _nesting.depth += 1
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            _blocked_s[0] += time.perf_counter() - start
            _nesting.depth -= 1

    timed._posaug_timed = True
    return timed


def blocked_seconds() -> float:
    """Seconds this process has spent in timed communication so far."""
    return _blocked_s[0]


def time_model_parallel_communication() -> None:
    """Time every pipeline send/receive and TP-region collective of Megatron (once per process)."""
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
    from megatron.core.tensor_parallel import mappings

    # a name a later Megatron lacks is left untimed: its waits then count as the rank's own time, nothing fails
    if hasattr(P2PCommunicator, "_communicate"):
        P2PCommunicator._communicate = timed_communication(P2PCommunicator._communicate)
    for name in _TP_COLLECTIVES:
        if hasattr(mappings, name):
            setattr(mappings, name, timed_communication(getattr(mappings, name)))


class StepTimes:
    """This rank's step times, with its time blocked in DP, PP and TP communication taken out."""

    def __init__(self, engine) -> None:
        self.own_s = 0.0
        self.steps = 0
        self._started = self._blocked_at_start = 0.0
        time_model_parallel_communication()
        engine.config.finalize_model_grads_func = timed_communication(engine.config.finalize_model_grads_func)

    def begin(self) -> None:
        """Before a training step."""
        self._blocked_at_start = blocked_seconds()
        self._started = time.perf_counter()

    def end(self, start_up: bool = False) -> None:
        """After a training step; a start-up step (the first after a start or resume) is not counted.

        That step's time holds one-off costs (allocator warm-up, first loads, NCCL's lazily created communicators)
        that differ between ranks for reasons other than their pace.
        """
        if start_up:
            return
        blocked = blocked_seconds() - self._blocked_at_start
        self.own_s += max(0.0, time.perf_counter() - self._started - blocked)
        self.steps += 1

    def gather(self, stalls: list[tuple[float, int]]) -> "Gathered":
        """Collective: every rank's own time, stalls and host since the last gather; resets the window."""
        mine = (self.own_s, self.steps, stalls, socket.gethostname())
        parts: list = [None] * dist.get_world_size()
        dist.all_gather_object(parts, mine)
        self.own_s, self.steps = 0.0, 0
        return Gathered(*([p[i] for p in parts] for i in range(4)))


class Gathered:
    """One window of every rank's times; `lines` and `scalars` say what rank 0 reports."""

    def __init__(self, own_s: list[float], steps: list[int], stalls: list[list[tuple[float, int]]],
                 hosts: list[str]) -> None:
        self.own_s, self.steps, self.stalls, self.hosts = own_s, steps, stalls, hosts
        self.median = statistics.median(own_s)
        self.slowest = max(range(len(own_s)), key=lambda r: own_s[r])
        self.ratio = own_s[self.slowest] / self.median if self.median > 0 else 1.0

    def lines(self, first: int, last: int, threshold: float, train_timeout_s: float) -> list[str]:
        """Console lines: the straggler above the threshold, then each stall."""
        out = []
        if len(self.own_s) > 1 and any(self.steps) and self.ratio >= threshold:
            r = self.slowest
            out.append(f"straggler: rank {r} on {self.hosts[r]} spent {self.own_s[r]:.2f} s outside collectives in "
                       f"steps {first}-{last}, {self.ratio:.2f}x the median rank ({self.median:.2f} s; "
                       f"logging.straggler_threshold={threshold:g})")
        for rank, stalls in enumerate(self.stalls):
            for seconds, step in stalls:
                out.append(f"stall: rank {rank} on {self.hosts[rank]} could not run for {seconds:.1f} s during step "
                           f"{step} (stopped or starved); not counted against parallel.train_timeout_seconds="
                           f"{train_timeout_s:g}, so the run went on")
        return out

    def scalars(self) -> dict[str, float]:
        """TensorBoard / W&B values of the window."""
        longest = max((s for stalls in self.stalls for s, _ in stalls), default=0.0)
        if not any(self.steps):  # a window of only the start-up step: no rank's pace to compare
            return {"perf/longest_stall_s": longest}
        return {"perf/straggler_ratio": self.ratio, "perf/slowest_rank": float(self.slowest),
                "perf/longest_stall_s": longest}
