"""`schedule.micro_batch_size: auto`: the trainer's seam to the planner that picks it (pretrain.plan registers one).

The memory estimate lives in pretrain.plan, a floor above the trainer; `python -m pretrain` registers its
planner before every command, as it registers the task suite. 'auto' takes the largest micro-batch that
divides global_batch_size / DP (and, with virtual pipeline stages, leaves a multiple of PP microbatches) whose
planned peak fits this rank's device memory: the GPU's total memory with CUDA, else this host's physical
memory shared by the ranks on it (the CPU is the device there, and a CPU run is sized by its RAM).
Kept free of torch at import, like task_data.
"""

from __future__ import annotations

import os
from typing import Any, Callable

AUTO = "auto"
# (config, world_size, memory_bytes) -> (micro-batch, its planned peak bytes); ValueError when none fits
Planner = Callable[[Any, int, int], tuple[int, float]]
_PLANNERS: list[Planner] = []


def register_micro_batch_planner(planner: Planner) -> None:
    """Make `planner` the one behind 'auto' (idempotent)."""
    _PLANNERS[:] = [planner]


def device_memory_bytes() -> tuple[int, str]:
    """(bytes 'auto' may plan for on this rank, what they are): the GPU's total, or the host's share per rank."""
    import torch

    if torch.cuda.is_available():
        index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        props = torch.cuda.get_device_properties(index)
        return props.total_memory, f"{props.name} ({props.total_memory / 2**30:.1f} GiB)"
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total // ranks, f"CPU: {total / 2**30:.1f} GiB host memory / {ranks} rank(s) on this host"


def resolve(config, world_size: int, memory: tuple[int, str] | None = None) -> str | None:
    """Replace schedule.micro_batch_size 'auto' by the planner's choice; the start-up line saying so, or None."""
    if config.schedule.micro_batch_size != AUTO:
        return None
    if not _PLANNERS:
        raise ValueError("schedule.micro_batch_size=auto needs the planner: `python -m pretrain` registers it; "
                         "from Python, import pretrain.plan.micro_batch first, or set a number")
    memory_bytes, where = memory if memory is not None else device_memory_bytes()
    chosen, peak = _PLANNERS[0](config, world_size, memory_bytes)
    config.schedule.micro_batch_size = chosen
    return (f"schedule.micro_batch_size=auto: {chosen} (plan: peak {peak / 2**30:.2f} GiB per rank of "
            f"{memory_bytes / 2**30:.1f} GiB; {where})")
