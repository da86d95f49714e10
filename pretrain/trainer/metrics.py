"""The training run's outputs besides checkpoints: the console line, TensorBoard scalars, MFU,
and `status.json`, the run's state for `python -m pretrain runs`.

MFU needs the device's peak FLOP/s. It comes from `logging.peak_tflops` when set, else from
PEAK_TFLOPS for known GPUs, else from a one-off matmul measured once per process (CPU, unknown
GPUs), so tokens/s and MFU are reported everywhere; the console says which source it used.
"""

from __future__ import annotations

import functools
import json
import math
import os
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist

from pretrain.console import Progress, format_duration

# Dense BF16 peak per device (TFLOP/s), for the MFU estimate.
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "V100": 125.0}
STATUS_FILE = "status.json"
RUN_STATES = ("running", "finished", "stopped", "failed")


def known_peak_tflops() -> float | None:
    """The table's peak for this process's GPU, if it is a known one."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((peak for key, peak in PEAK_TFLOPS.items() if key in name), None)


@functools.lru_cache(maxsize=None)
def measured_peak_tflops(device: str = "cpu", dtype: torch.dtype = torch.float32, size: int = 1024,
                         seconds: float = 0.25) -> float:
    """Matmul TFLOP/s of this device measured once per process (the best of repeated n×n products)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    torch.matmul(a, b)  # warm-up (thread pool, kernel selection)
    sync()
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline or best == 0.0:
        start = time.perf_counter()
        torch.matmul(a, b)
        sync()
        best = max(best, 2 * size ** 3 / max(time.perf_counter() - start, 1e-9) / 1e12)
    return best


def peak_tflops(configured: float | None, bf16: bool = False) -> tuple[float, str]:
    """(peak TFLOP/s per device, where it came from): config, table, or measured matmul."""
    if configured:
        return float(configured), "logging.peak_tflops"
    known = known_peak_tflops()
    if known:
        return known, f"table ({torch.cuda.get_device_name()})"
    if torch.cuda.is_available():
        dtype = torch.bfloat16 if bf16 else torch.float32
        return measured_peak_tflops("cuda", dtype, 4096), "measured matmul"
    return measured_peak_tflops("cpu", torch.float32), f"measured {torch.get_num_threads()}-thread fp32 matmul"


def config_summary(config) -> str:
    """One line naming what the resolved config runs: name, size, method, seed, layers, precision."""
    from pretrain.naming import method_name, size_name

    model = config.model
    precision = "fp8" if model.fp8 else "bf16" if model.bf16 else "fp32"
    return (f"{config.name} | size {size_name(model)} | method {method_name(config.positions, model.seq_length)} | "
            f"seed {config.seed} | w={model.seq_length} | {model.transformer_impl} layers, {precision} | "
            f"lr {config.optimizer.lr:g}")


def write_status(run_dir: str | Path, state: str, iteration: int, train_iters: int, **extra) -> None:
    """Atomically write the run's status.json (state, iteration, pid, host, time)."""
    run_dir = Path(run_dir)
    record = {"state": state, "iteration": iteration, "train_iters": train_iters, "pid": os.getpid(),
              "host": socket.gethostname(), "updated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              **extra}
    tmp = run_dir / f"{STATUS_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, run_dir / STATUS_FILE)


def read_status(run_dir: str | Path) -> dict | None:
    """The run's status.json, or None (runs from before status files, or never started)."""
    path = Path(run_dir) / STATUS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class Metrics:
    """Console lines on rank 0 (with a redrawn progress line on a terminal), TensorBoard scalars on the
    last rank (which holds the loss, as in Megatron), and the run's status.json on rank 0."""

    def __init__(self, config, total_iters: int, start: int = 0) -> None:
        self.total_iters = total_iters
        self.run_dir = config.run_dir
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.writer = None
        if self.rank == self.world - 1:
            from torch.utils.tensorboard import SummaryWriter

            tb_dir = config.logging.tensorboard_dir or str(config.run_dir / "tensorboard")
            self.writer = SummaryWriter(log_dir=tb_dir)
        self.peak, self.peak_source = peak_tflops(config.logging.peak_tflops, config.model.bf16)
        self.flops_per_token = config.model.flops_per_token()
        self.progress = Progress(total_iters, desc="train", start=start, enabled=self.rank == 0)
        self.iteration = start
        if self.rank == 0:
            write_status(self.run_dir, "running", start, total_iters)
            print(f"MFU against a peak of {self.peak:.3g} TFLOP/s per device ({self.peak_source})", flush=True)

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        """Write scalars to TensorBoard (last rank only)."""
        if self.writer is not None:
            for name, value in values.items():
                if value is not None and math.isfinite(value):
                    self.writer.add_scalar(name, value, step)

    def console(self, text: str) -> None:
        """One persistent line on rank 0."""
        if self.rank == 0:
            self.progress.write(text)

    def step(self, done: int, postfix: str = "") -> None:
        """After each optimizer step: redraw the terminal progress line (rank 0)."""
        self.iteration = done
        if self.rank == 0 and self.progress.terminal:
            self.progress.update(done, postfix)
        else:
            self.progress.done = done

    def heartbeat(self, done: int) -> None:
        """At each log interval: refresh status.json so `runs` can tell running from dead."""
        if self.rank == 0:
            write_status(self.run_dir, "running", done, self.total_iters)

    def mfu(self, tokens_per_s: float) -> float:
        """Model FLOPs utilisation against the peak of `peak_source`, over all ranks."""
        return tokens_per_s * self.flops_per_token / (self.peak * 1e12 * self.world)

    def eta(self) -> str:
        """Time left for the run at the average rate since (re)start."""
        eta = self.progress.eta_s
        return format_duration(eta) if eta is not None else "--:--:--"

    def close(self) -> None:
        """Flush TensorBoard and record the final state (failed when an exception is propagating)."""
        if self.writer is not None:
            self.writer.close()
        self.progress.close()
        if self.rank != 0:
            return
        from pretrain.trainer.checkpoint import latest_iteration

        error = sys.exc_info()[1]  # close() runs in the loop's `finally`
        saved = latest_iteration(self.run_dir) or 0
        if error is not None:
            state, extra = "failed", {"error": f"{type(error).__name__}: {error}"[:500]}
        else:
            state, extra = ("finished" if saved >= self.total_iters else "stopped"), {}
        write_status(self.run_dir, state, self.iteration, self.total_iters, checkpoint_iteration=saved, **extra)
