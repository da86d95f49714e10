"""DroPE's learning-rate restart: at the switch step of a run that drops RoPE (positions.strategy=drope) the
schedule starts again, the run's own schedule replayed over the recalibration steps (megatron_ext/positions/drope.py
says why: the paper's recalibration is a new run with its own warmup and decay).

`RecalibrationSchedule` stands where the engine keeps Megatron's OptimizerParamScheduler: two of them, the run's and
the recalibration's, one active at a time. Which one is active is a function of the loop's step (`begin(step)` before
each optimizer step), never of how many updates were applied, so a skipped iteration (which advances neither) does not
move the switch. Its state (both schedulers and which is active) is the checkpoint's `scheduler` record, so a run
resumed before, at or after the switch sets the same learning rate bitwise.
"""

from __future__ import annotations

import math


def recalibration_warmup(warmup_iters: int, total_steps: int, recalibration_steps: int) -> int:
    """The run's warmup share of its steps applied to the recalibration steps (rounded half up, < the steps)."""
    warmup = math.floor(warmup_iters * recalibration_steps / max(1, total_steps) + 0.5)
    return min(warmup, recalibration_steps - 1)


class RecalibrationSchedule:
    """The run's scheduler until `start`, then a fresh one over the last `total_steps - start` steps."""

    def __init__(self, scheduler, *, start: int, total_steps: int, warmup_iters: int) -> None:
        """`scheduler(warmup, decay_steps)`: the run's OptimizerParamScheduler over that many steps (Engine's)."""
        if not 0 < start < total_steps:
            raise ValueError(f"the recalibration must start inside the run (got step {start} of {total_steps})")
        steps = total_steps - start
        self.start = start
        self.recalibration = scheduler(recalibration_warmup(warmup_iters, total_steps, steps), steps)
        self.pretraining = scheduler(warmup_iters, total_steps)  # built last: its learning rate is the one set
        self.recalibrating = False

    @property
    def active(self):
        """The scheduler that sets the learning rate now."""
        return self.recalibration if self.recalibrating else self.pretraining

    def begin(self, step: int) -> None:
        """Before optimizer step `step`: from `start` on, the recalibration's schedule sets the learning rate."""
        if step >= self.start and not self.recalibrating:
            self.recalibrating = True
            self.recalibration.step(increment=0)

    def step(self, increment: int) -> None:
        """After a successful update: the active schedule advances (Megatron's OptimizerParamScheduler.step)."""
        self.active.step(increment=increment)

    def state_dict(self) -> dict:
        """Both schedules and which one is active (JSON-serialisable, as Megatron's)."""
        return {"pretraining": self.pretraining.state_dict(), "recalibration": self.recalibration.state_dict(),
                "recalibrating": self.recalibrating, "start": self.start}

    def load_state_dict(self, state: dict) -> None:
        """Restore a state_dict(); ValueError when the checkpoint's schedule is not a recalibration's."""
        if not isinstance(state, dict) or "recalibration" not in state:
            raise ValueError("the checkpoint's learning-rate schedule has no DroPE recalibration: resume it with the "
                             "positions.strategy and positions.drope_share it was trained with")
        if state["start"] != self.start:
            raise ValueError(f"the checkpoint's recalibration starts at step {state['start']}, this run's at "
                             f"{self.start}: resume it with the positions.drope_share and steps it was trained with")
        self.pretraining.load_state_dict(state["pretraining"])
        self.recalibration.load_state_dict(state["recalibration"])
        self.recalibrating = bool(state["recalibrating"])
        self.active.step(increment=0)  # the active schedule's learning rate is the one the optimizer keeps
