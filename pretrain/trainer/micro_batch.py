"""`schedule.micro_batch_size: auto`: the trainer's seam to the planner that picks it (pretrain.plan registers one).

The memory estimate lives in pretrain.plan, a floor above the trainer; `python -m pretrain` registers its
planner before every command, as it registers the task suite. 'auto' takes the largest micro-batch that
divides global_batch_size / DP (and, with virtual pipeline stages, leaves a multiple of PP microbatches) whose
planned peak fits the memory this rank can have now: the GPU's free memory with CUDA, else this host's available
memory shared by the ranks on it (the CPU is the device there, and a CPU run is sized by its free RAM).
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


MEMINFO = "/proc/meminfo"
CGROUP = "/sys/fs/cgroup"


def host_available_bytes() -> int:
    """Memory a new allocation can get on this host now: MemAvailable, or the cgroup's room when that is lower."""
    free = None
    with open(MEMINFO) as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    try:
        limit = open(f"{CGROUP}/memory.max").read().strip()
        used = int(open(f"{CGROUP}/memory.current").read())
        if limit != "max":
            free = min(free if free is not None else int(limit), int(limit) - used)
    except (OSError, ValueError):
        pass
    return free if free is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def device_memory_bytes() -> tuple[int, str]:
    """(bytes 'auto' may plan for on this rank, what they are): the GPU's free memory, or the host's available
    memory shared by the ranks on it (what is free now, not what is installed: other jobs hold the rest)."""
    import torch

    if torch.cuda.is_available():
        index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        free, total = torch.cuda.mem_get_info(index)
        name = torch.cuda.get_device_properties(index).name
        return free, f"{name}: {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB"
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    free = host_available_bytes()
    return free // ranks, (f"CPU: {free / 2**30:.1f} GiB available of {total / 2**30:.1f} GiB host memory / "
                           f"{ranks} rank(s) on this host")


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
