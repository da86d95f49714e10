"""The training run's outputs besides checkpoints: the console line, TensorBoard scalars, MFU,
and `status.json`, the run's state for `python -m pretrain runs`.

MFU needs the device's peak FLOP/s. It comes from `logging.peak_tflops` when set, else from
PEAK_TFLOPS for known GPUs, else from a one-off matmul measured once per process (CPU, unknown
GPUs), so tokens/s and MFU are reported everywhere; the console says which source it used.
"""

from __future__ import annotations

# Reaches into a library's internals (checked against tensorboard 2.20):
# - the class name of tensorboard's event writer thread (_AsyncWriterThread): its write error is
#   handed to the main thread (reported as one line, see Metrics._tensorboard) and also re-raised in
#   the thread, whose traceback threading.excepthook would print; only that duplicate is dropped.

import contextlib
import functools
import json
import math
import os
import socket
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist

from pretrain.console import Progress, format_duration
from data_prep.errors import OutputError, write_fault
from pretrain.trainer.run_dir import run_output

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
    from pretrain.experiments.runs import method_name, size_name

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
    try:
        with run_output(run_dir, run_dir / STATUS_FILE, "the run's status file"):
            tmp.write_text(json.dumps(record, indent=1))
            os.replace(tmp, run_dir / STATUS_FILE)
    finally:
        with contextlib.suppress(OSError):  # nothing half-written stays behind
            tmp.unlink(missing_ok=True)


def read_status(run_dir: str | Path) -> dict | None:
    """The run's status.json, or None (runs from before status files, or never started)."""
    path = Path(run_dir) / STATUS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _drop_writer_thread_tracebacks() -> None:
    """Silence the TensorBoard writer thread's own traceback of a write fault (the main thread reports it)."""
    previous = threading.excepthook
    if getattr(previous, "drops_writer_faults", False):
        return

    def hook(args) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and write_fault(args.exc_value) is not None:
            return
        previous(args)

    hook.drops_writer_faults = True
    threading.excepthook = hook


def status_problem(run_dir: str | Path) -> str | None:
    """Why the run's status.json cannot be trusted (empty, not JSON, no known state), or None (fine or absent)."""
    path = Path(run_dir) / STATUS_FILE
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return None
    except OSError as error:
        return f"unreadable ({os.strerror(error.errno) if error.errno else error})"
    if not text.strip():
        return "empty"
    try:
        record = json.loads(text)
    except ValueError:
        return "not valid JSON (truncated or overwritten)"
    if not isinstance(record, dict) or record.get("state") not in RUN_STATES:
        return f"holds no known state (one of {', '.join(RUN_STATES)})"
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

            self.tb_dir = config.logging.tensorboard_dir or str(config.run_dir / "tensorboard")
            _drop_writer_thread_tracebacks()
            try:
                with self._tensorboard():
                    self.writer = SummaryWriter(log_dir=self.tb_dir)
            except OutputError as error:  # before the loop's `finally` exists: record the failure here
                if self.rank == 0:
                    with contextlib.suppress(OutputError):
                        write_status(self.run_dir, "failed", start, total_iters,
                                     error=f"{type(error).__name__}: {error}"[:1000])
                raise
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
            with self._tensorboard():
                for name, value in values.items():
                    if value is not None and math.isfinite(value):
                        self.writer.add_scalar(name, value, step)
                self.writer.flush()  # a full disk shows at this step, not minutes later in a background thread

    def _tensorboard(self):
        """Write faults of the TensorBoard writer become one OutputError naming its directory and the fix."""
        return run_output(self.run_dir, self.tb_dir, "TensorBoard events",
                          elsewhere="pass --set logging.tensorboard_dir=<a directory on a larger disk>")

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
        failure = propagating = sys.exc_info()[1]  # close() runs in the loop's `finally`
        if self.writer is not None:
            writer, self.writer = self.writer, None
            try:
                with self._tensorboard():
                    writer.close()
            except OutputError as error:
                failure = failure or error
        self.progress.close()
        if self.rank == 0:
            from pretrain.trainer.checkpoint import latest_iteration

            saved = latest_iteration(self.run_dir) or 0
            if failure is not None:
                state, extra = "failed", {"error": f"{type(failure).__name__}: {failure}"[:1000]}
            else:
                state, extra = ("finished" if saved >= self.total_iters else "stopped"), {}
            try:
                write_status(self.run_dir, state, self.iteration, self.total_iters, checkpoint_iteration=saved,
                             **extra)
            except OutputError as error:
                if failure is None:
                    raise
                print(f"warning: the failure could not be recorded in {STATUS_FILE}: {error}", file=sys.stderr,
                      flush=True)
        if failure is not None and failure is not propagating:
            raise failure
