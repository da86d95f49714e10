"""Process groups for one run: torchrun/SLURM environment or a single local process.

Timeouts: every group is created with `parallel.distributed_timeout_minutes` (start-up, checkpoint load and the
first step, when ranks legitimately wait on each other for long); `set_timeout` changes them all at once, which
the training loop does after the first step (the train timeout) and around checkpoint saves and validation (back
to the long one). The groups always get PG_GRACE_S more than the hang watchdog, so the watchdog, which reports,
acts first; the groups' own timeout is the fallback where it cannot run.
"""

from __future__ import annotations

# Reaches into torch.distributed internals (checked against torch 2.6, 2.13 and 2.15):
# - distributed_c10d._set_pg_timeout (private, documented in its docstring): the only way to change a created
#   group's timeout before torch 2.15 (torchtitan tightens its timeouts after the first step the same way). From
#   2.15 the public `torch.distributed.set_timeout` exists and `_set_pg_timeout` warns that it is deprecated, so
#   the public one is used wherever it exists (feature detection, not a version string).
# - distributed_c10d._world.pg_map: every group this process belongs to, Megatron's included (Megatron keeps
#   no list of the groups it creates), read by `set_timeout` and emptied of Megatron's by `_destroy_megatron_groups`.
# - ProcessGroup._get_backend(device).options._timeout: a group's collective timeout, read back by
#   `groups_off_timeout` to check the promise above (no public getter).

import logging
import os
import socket
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from megatron_ext import cpu_compat
from megatron_ext.model import ParallelConfig


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PG_GRACE_S = 30.0
FLIGHT_RECORDER_ENTRIES = "2000"  # torch's flight recorder: the last collectives of every group, per rank


def initialize(parallel: ParallelConfig, seed: int) -> None:
    """Create the world group (NCCL + gloo on GPU, gloo on CPU) and Megatron's model-parallel groups, all with
    `parallel.distributed_timeout_minutes`."""
    timeout_s = 60.0 * parallel.distributed_timeout_minutes + PG_GRACE_S
    if not torch.cuda.is_available():
        cpu_compat.apply()
    if not dist.is_initialized():
        # On GPUs, NCCL for CUDA tensors and gloo beside it for the small CPU tensors the trainer agrees on
        # (loss, flags, checkpoint outcome): NCCL alone refuses those ("No backend type ... cpu", first GPU run).
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        # read when a group is created; the hang watchdog dumps it beside the stacks (NCCL and gloo alike)
        if "TORCH_NCCL_TRACE_BUFFER_SIZE" not in os.environ:  # the deprecated name, when a user set it
            os.environ.setdefault("TORCH_FR_BUFFER_SIZE", FLIGHT_RECORDER_ENTRIES)
        if "RANK" in os.environ:  # torchrun / srun: env:// rendezvous
            dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
        else:
            # A world of one. Not via os.environ: child processes (tests, reproduce, sbatch jobs)
            # would inherit MASTER_PORT and collide with this process's store.
            dist.init_process_group(backend=backend, init_method=f"tcp://127.0.0.1:{_free_port()}",
                                    rank=0, world_size=1, timeout=timedelta(seconds=timeout_s))
    parallel.data_parallel_size(dist.get_world_size())
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    _destroy_megatron_groups()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=parallel.virtual_pipeline_model_parallel_size,
        context_parallel_size=parallel.context_parallel_size,
        distributed_timeout_minutes=timeout_s / 60.0,
    )
    seed_all(seed)
    model_parallel_cuda_manual_seed(seed)


def set_timeout(seconds: float) -> list[str]:
    """Give every process group of this rank (world and Megatron's) the collective timeout `seconds` + PG_GRACE_S;
    returns, and logs as a warning, each group left with another timeout and why."""
    from torch.distributed import distributed_c10d as c10d

    wanted = timedelta(seconds=seconds + PG_GRACE_S)
    set_group_timeout = getattr(dist, "set_timeout", None) or c10d._set_pg_timeout
    errors: dict[str, str] = {}
    for group in list(c10d._world.pg_map):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # torch warns, and sets nothing, for a backend it cannot change
                set_group_timeout(wanted, group)
        except (ValueError, AssertionError, RuntimeError, Warning) as error:
            errors[_describe(group)] = str(error)
    missed = [f"{name}: {now}" + (f" ({errors[name]})" if name in errors else "")
              for name, now in groups_off_timeout(seconds).items()]
    if missed:
        logging.getLogger("pretrain").warning(
            "could not give %d process group(s) the collective timeout %.0f s (%.0f s + %.0f s grace), so the hang "
            "watchdog may not act before them: %s", len(missed), wanted.total_seconds(), seconds, PG_GRACE_S,
            "; ".join(missed))
    return missed


def groups_off_timeout(seconds: float) -> dict[str, str]:
    """{group: its timeout} of every process group of this rank whose collective timeout is not `seconds` +
    PG_GRACE_S (the promise that the groups outlive the hang watchdog by PG_GRACE_S)."""
    from torch.distributed import distributed_c10d as c10d

    wanted = seconds + PG_GRACE_S
    off = {}
    for group in list(c10d._world.pg_map):
        timeouts = set()
        for device in group._device_types:
            try:
                timeouts.add(group._get_backend(device).options._timeout.total_seconds())
            except (AttributeError, RuntimeError):  # a backend without options: its timeout cannot be read
                timeouts.add(float("nan"))
        if timeouts != {wanted}:
            off[_describe(group)] = ", ".join(f"{t:.0f} s" for t in sorted(timeouts))
    return off


def _describe(group) -> str:
    from torch.distributed import distributed_c10d as c10d

    name = getattr(group, "group_desc", "") or c10d._world.pg_names.get(group, "?")
    return f"{name} {c10d.get_process_group_ranks(group)}"


def seed_all(seed: int) -> None:
    """Seed Python, NumPy and torch's default RNG (weights are drawn from it on CPU init)."""
    import random

    import numpy

    random.seed(seed)
    numpy.random.seed(seed % 2**32)
    torch.default_generator.manual_seed(seed)


def data_parallel_info() -> tuple[int, int]:
    """(rank, size) of this process in its data-parallel group."""
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()


def _destroy_megatron_groups() -> None:
    """Destroy every group but the world, then Megatron's references to them.

    Megatron's destroy_model_parallel only drops its references: torch keeps each group, and a gloo group keeps three
    threads and its sockets, so a process that initialised again (one evaluation per checkpoint, a test script
    looping over strategies) grew by ~30 groups each time (a PP=2 script: 599 groups, 1,797 threads per rank). The
    barrier first: a rank that closed a group while another still connected its last pair failed that one's
    connectFullMesh ("Connection closed by peer")."""
    from megatron.core import parallel_state
    from torch.distributed import distributed_c10d as c10d

    groups = [group for group in c10d._world.pg_map if group is not dist.group.WORLD] if dist.is_initialized() else []
    if groups:
        dist.barrier()
        for group in groups:
            dist.destroy_process_group(group)
    parallel_state.destroy_model_parallel()


def destroy() -> None:
    """Tear down Megatron's groups and the world group (which takes every other group with it)."""
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
