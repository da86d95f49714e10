"""Training health as pruning needs it: the first skipped update or loss spike after a healthy step makes the
newest checkpoint saved before it the run's last healthy one (run_commit.record_trouble), which pruning keeps beside
the newer ones, so a divergence cannot cost every good checkpoint (keep_last counts only the newest)."""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path

from pretrain.trainer.run_commit import record_trouble

SPIKE_FACTOR = 2.0  # a loss above this many times the mean of the recent ones is a spike
SPIKE_WINDOW = 20  # recent losses the mean is taken over
SPIKE_MIN_STEPS = 5  # steps seen before a spike can be called


def is_spike(loss: float, recent: deque) -> bool:
    """True when `loss` is non-finite or far above the mean of `recent` losses (enough of them seen)."""
    if not math.isfinite(loss):
        return True
    return len(recent) >= SPIKE_MIN_STEPS and loss > SPIKE_FACTOR * (sum(recent) / len(recent))


class Health:
    """Per-step watch of one training process (rank 0 writes the record)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.recent, self.healthy = run_dir, deque(maxlen=SPIKE_WINDOW), True

    def step(self, done: int, loss: float | None, update_successful: bool) -> None:
        """Step `done` finished with `loss` (None where it was not read); mark the last healthy checkpoint when
        trouble starts here. The loss is read only at log steps and skips (one host sync per step), so spikes are
        judged on those steps' losses."""
        trouble = ("update skipped" if not update_successful
                   else "loss spike" if loss is not None and is_spike(loss, self.recent) else None)
        if trouble is None and loss is not None:
            self.recent.append(loss)
        elif self.healthy:  # the start of a streak: the checkpoint before it is the healthy one
            record_trouble(self.run_dir, done, f"{trouble} at step {done}")
        self.healthy = trouble is None
