"""Counting device→host syncs: each `aten._local_scalar_dense` (`.item()`, `bool()`, `float()`, `int()` of a tensor).

On a GPU a read of a CUDA tensor waits for every kernel queued before it; a read of a host tensor does not.
With the model on the CPU every tensor is a host tensor, so there the reads that stay on the host on a GPU
too are named by where they happen (HOST_READS) and left out; every other read counts as a device sync.
"""

from __future__ import annotations

import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# (file suffix, function): reads of tensors that live on the host on a GPU as well
HOST_READS = {
    # torch's Adam/AdamW (foreach or single-tensor) keep each param's `step` on the host unless fused or
    # capturable, and read it per param (torch/optim/optimizer.py `_get_value`); the fused step reads none
    ("torch/optim/optimizer.py", "_get_value"): "torch Adam's host step counter",
    # the per-step PosAug α is drawn from a CPU generator on purpose (megatron_ext/positions/draws.py)
    ("megatron_ext/positions/draws.py", "sample_alpha"): "PosAug's α from a CPU generator",
    # Megatron's RNG tracker (TP dropout/init regions) compares torch.get_rng_state(), a CPU tensor, on leaving fork()
    ("megatron/core/tensor_parallel/random.py", "fork"): "Megatron's CPU RNG state check",
}


def _host_read_site() -> str | None:
    frame = sys._getframe(2)
    while frame is not None:
        key = (frame.f_code.co_filename.replace("\\", "/"), frame.f_code.co_name)
        for (suffix, function), why in HOST_READS.items():
            if key[1] == function and key[0].endswith(suffix):
                return why
        frame = frame.f_back
    return None


def _caller() -> str:
    """file:line of the innermost frame outside torch (what a failing test names)."""
    frame = sys._getframe(2)
    while frame is not None and ("/torch/" in frame.f_code.co_filename or frame.f_code.co_filename == __file__
                                 or frame.f_code.co_filename.endswith("megatron_ext/cpu_compat.py")):
        frame = frame.f_back
    return "?" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})"


class HostSyncCounter(TorchDispatchMode):
    """Counts device→host syncs made while active; `sites` says where each one came from."""

    def __init__(self, device: torch.device | str | None = None) -> None:
        super().__init__()
        if device is None:
            device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        self.device_type = torch.device(device).type
        self.sites: list[str] = []
        self.host_reads = 0  # reads left out as host-only (on a CPU device)

    @property
    def count(self) -> int:
        """Device→host syncs seen so far."""
        return len(self.sites)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105
        if func is torch.ops.aten._local_scalar_dense.default and args[0].device.type == self.device_type:
            if self.device_type == "cpu" and _host_read_site() is not None:
                self.host_reads += 1
            else:
                self.sites.append(_caller())
        return func(*args, **(kwargs or {}))
