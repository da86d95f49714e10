"""How benchmarks/bench_gpu_step.py measures one variant's step: seconds for steps back to back (the device drained
before and after), device->host syncs per step (a TorchDispatchMode counting aten._local_scalar_dense, or the
trainer's own counter where this build has it), and kernel launches per step with a chrome trace (torch.profiler:
CUDA kernel events; on a CPU there are none, so CPU aten ops are counted and the result says so).

Private API reached (torch 2.11 CUDA and 2.13 CPU checked): torch.utils._python_dispatch.TorchDispatchMode, the only
way to see every aten._local_scalar_dense (each device->host read) made inside a step, where only this build has no
pretrain.trainer.host_syncs counter of its own.
"""

from __future__ import annotations

import gzip
import shutil
import time
from pathlib import Path
from typing import Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode

LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
TRACE_STEPS = 3


class Stepper(Protocol):
    """What is measured: one optimizer step per call (bench_gpu_step.Variant)."""

    def step(self) -> None:
        """One optimizer step."""


class SyncCounter:
    """Device->host syncs: the trainer's own counter (pretrain.trainer.host_syncs) where this build has it, else
    every aten._local_scalar_dense on the device's tensors (on a CPU that includes reads that stay on the host)."""

    def __init__(self, device_type: str) -> None:
        try:
            from pretrain.trainer.host_syncs import HostSyncCounter

            self.mode, self.how = HostSyncCounter(device_type), "pretrain.trainer.host_syncs.HostSyncCounter"
        except ImportError:
            self.mode, self.how = ScalarReads(device_type), "aten._local_scalar_dense on " + device_type
            if device_type == "cpu":
                self.how += " (every scalar read, host-only ones included)"

    @property
    def count(self) -> int:
        """Syncs counted so far."""
        return self.mode.count


class ScalarReads(TorchDispatchMode):
    """Counts aten._local_scalar_dense (`.item()`, `bool()`, `float()` of a tensor) on one device type."""

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type, self.count = device_type, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105
        if func is torch.ops.aten._local_scalar_dense.default and args[0].device.type == self.device_type:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_block(variant: Stepper, steps: int) -> float:
    """Seconds for `steps` steps back to back (the device drained before and after)."""
    _synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        variant.step()
    _synchronize()
    return time.perf_counter() - start


def count_syncs(variant: Stepper, device_type: str) -> tuple[int | None, str]:
    """Device->host syncs in one step, and how they were counted (None with the reason when counting failed)."""
    counter = SyncCounter(device_type)
    try:
        with counter.mode:
            variant.step()
    except Exception as error:  # e.g. a compiled graph refusing a dispatch mode: reported, not fatal
        return None, f"{counter.how}: failed ({type(error).__name__}: {str(error).splitlines()[0][:120]})"
    return counter.count, counter.how


def profile(variant: Stepper, trace: Path, cuda: bool, steps: int = TRACE_STEPS) -> tuple[float, str]:
    """Kernel launches (or CPU ops) per step over `steps` steps; the chrome trace gzipped to `trace`."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _synchronize()
    with torch_profile(activities=activities) as prof:
        for _ in range(steps):
            variant.step()
        _synchronize()
    raw = trace.with_suffix("")  # trace_*.json, then gzipped beside it
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(trace, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    events = prof.events()
    if cuda:
        kernels = [e for e in events if e.device_type.name == "CUDA" and not e.name.startswith(("Memcpy", "Memset"))]
        if kernels:
            return len(kernels) / steps, "CUDA kernel events"
        # a profiler build that records no device events still records the host's launch calls
        calls = [e for e in events if e.name in LAUNCH_CALLS]
        return len(calls) / steps, "host kernel-launch calls (no CUDA kernel events recorded)"
    ops = [e for e in events if e.name.startswith("aten::")]
    return len(ops) / steps, "CPU aten ops, nested ones included (no CUDA: not kernel launches)"
