"""Straggler and stall report: every `logging.straggler_interval` steps the ranks gather their step times.

A rank's own time is the step's wall time minus the time it spent in Megatron's gradient synchronisation
(`finalize_model_grads`: the data-parallel all-reduce or reduce-scatter, the embedding and layer-norm grad
all-reduces), so a rank that waits for a slow peer does not look slow itself. Pipeline sends and receives
inside the schedule cannot be told apart from compute and count as the rank's own time.

Rank 0 prints the slowest rank and its ratio to the median when the ratio reaches
`logging.straggler_threshold`, and every stall a rank's watchdog saw (its thread could not run: the process
was stopped or starved; watchdog.py) with the step it hit; TensorBoard gets perf/straggler_ratio,
perf/slowest_rank and perf/longest_stall_s at every gather.
"""

from __future__ import annotations

import socket
import statistics
import time
from typing import Callable

import torch.distributed as dist


class StepTimes:
    """This rank's step times, with the gradient synchronisation taken out."""

    def __init__(self, engine) -> None:
        self.own_s = 0.0
        self.steps = 0
        self._sync_s = 0.0
        self._started = 0.0
        finalize: Callable = engine.config.finalize_model_grads_func

        def timed_finalize(*args, **kwargs):
            start = time.perf_counter()
            try:
                return finalize(*args, **kwargs)
            finally:
                self._sync_s += time.perf_counter() - start

        engine.config.finalize_model_grads_func = timed_finalize

    def begin(self) -> None:
        """Before a training step."""
        self._sync_s = 0.0
        self._started = time.perf_counter()

    def end(self) -> None:
        """After a training step."""
        self.own_s += max(0.0, time.perf_counter() - self._started - self._sync_s)
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
        if len(self.own_s) > 1 and self.ratio >= threshold:
            r = self.slowest
            out.append(f"straggler: rank {r} on {self.hosts[r]} spent {self.own_s[r]:.2f} s outside collectives in "
                       f"steps {first}-{last}, {self.ratio:.2f}x the median rank ({self.median:.2f} s; "
                       f"logging.straggler_threshold={threshold:g})")
        for rank, stalls in enumerate(self.stalls):
            for seconds, step in stalls:
                out.append(f"stall: rank {rank} on {self.hosts[rank]} could not run for {seconds:.1f} s during step "
                           f"{step} (stopped or starved); shorter than parallel.train_timeout_seconds="
                           f"{train_timeout_s:g}, so the run went on")
        return out

    def scalars(self) -> dict[str, float]:
        """TensorBoard / W&B values of the window."""
        longest = max((s for stalls in self.stalls for s, _ in stalls), default=0.0)
        return {"perf/straggler_ratio": self.ratio, "perf/slowest_rank": float(self.slowest),
                "perf/longest_stall_s": longest}
