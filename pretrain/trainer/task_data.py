"""The trainer's seam for `data.task` runs: the provider registers here (pretrain.tasks does, at import).

Kept free of torch so that registering a provider costs nothing: `python -m pretrain` registers the task
suite's before every command, `--help` included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class TaskDataSource:
    """What the trainer needs of the provider of `data.task` runs (pretrain.tasks registers one): a check of the
    config (ValueError naming the field and the fix) and the (train, valid) sample sources."""

    check: Callable[[Any, Any], None]  # (DataConfig, ModelConfig)
    datasets: Callable[[Any, int, int], tuple[Any, Any]]  # (DataConfig, seq_length, seed) -> 2 SampleSources
    eod: int  # the token that ends an example (document masking's boundary)


_TASK_SOURCES: list[TaskDataSource] = []  # the trainer's seam: it knows task data only by registration


def register_task_source(source: TaskDataSource) -> None:
    """Make `source` the provider of `data.task` (idempotent: a module imported twice registers once)."""
    _TASK_SOURCES[:] = [source]


def task_source() -> TaskDataSource:
    """The registered provider of `data.task`, or a ValueError naming how to register one."""
    if not _TASK_SOURCES:
        raise ValueError("data.task is set but no task data source is registered: `python -m pretrain` registers "
                         "pretrain.tasks; from Python, import pretrain.tasks before loading the config")
    return _TASK_SOURCES[0]
