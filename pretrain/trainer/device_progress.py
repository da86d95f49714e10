"""Per-rank GPU progress for the hang watchdog: the last kernel of each phase as a CUDA event, polled with query().

The watchdog's other counters are host-side: under NCCL kernels and collectives are queued and return at once, so
a rank whose GPU (or its link) stalls still lets its host run on to the next host sync, where every rank's host
then waits at the same point and the counters name nobody. An event recorded on the rank's current stream when a
phase ends is done only once the GPU finished everything queued before it: a rank whose event is still pending
while the other ranks' are done is the rank whose GPU work has not finished, and the report names it.

Without CUDA (CPU runs, gloo) nothing is recorded and heartbeats carry nothing of it. Any event source with
`record()` and `query()` serves (`make_event`): tests drive it on CPU with events that stop completing.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Any, Callable

MAX_PENDING = 64  # events kept unfinished; a GPU further behind keeps its oldest, the one the report names


def _cuda_event() -> Any | None:
    """A CUDA event once this process uses CUDA, else None (checked at each mark: CUDA starts after the watchdog)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda.Event()


class DeviceProgress:
    """Events marking the end of each phase's GPU work, written by the main thread, polled by the watchdog's."""

    def __init__(self, make_event: Callable[[], Any | None] = _cuda_event) -> None:
        self.make_event = make_event
        self._queued: deque[tuple[str, Any]] = deque()  # (phase label, event), oldest first
        self.used = False

    def mark(self, label: str) -> None:
        """The GPU work queued so far ends `label` (a phase of a step): record an event after it."""
        if len(self._queued) >= MAX_PENDING:
            return
        event = self.make_event()
        if event is None:
            return
        event.record()
        self.used = True
        self._queued.append((label, event))

    def pending(self) -> str | None:
        """The oldest phase whose GPU work has not finished (None when the GPU has caught up)."""
        while self._queued:
            label, event = self._queued[0]
            if not event.query():
                return label
            self._queued.popleft()
        return None

    def record(self) -> dict:
        """What a heartbeat carries: the phase the GPU has not finished, when this rank records events at all."""
        return {"gpu_pending": self.pending()} if self.used else {}
