"""The training run's outputs besides checkpoints: the console line, scalars (TensorBoard, W&B: tracking.py), MFU,
and `status.json`, the run's state for `python -m pretrain runs`.

MFU counts FLOPs as plan does (megatron_ext.model_config.FLOP_CONVENTION, PaLM's) against the device's peak
FLOP/s (peak.py: config, known GPU, or a cached measurement); the console says where the peak came from. An MFU
above 100 % is impossible: `Metrics.mfu` warns once and returns None from then on, so no console line and no
scalar writer ever gets it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_ext.model_config import FLOP_CONVENTION, model_flops_utilization
from pretrain.faults import OutputError
from pretrain.console import Progress, format_duration
from pretrain.trainer.peak import Peak, device_peak, forget, plausible_mfu
from pretrain.trainer.run_dir import run_output
from pretrain.trainer.tracking import open_trackers

STATUS_FILE = "status.json"
RUN_STATES = ("running", "finished", "stopped", "failed", "hung")  # hung: written by watchdog.py


def config_summary(config) -> str:
    """One line naming what the resolved config runs: name, size, method, seed, layers, precision."""
    from pretrain.naming import method_name, size_name

    model = config.model
    precision = "fp8" if model.fp8 else "bf16" if model.bf16 else "fp32"
    return (f"{config.name} | size {size_name(model)} | method {method_name(config.positions, model.seq_length, model)} | "
            f"seed {config.seed} | w={model.seq_length} | {model.transformer_impl} layers, {precision} | "
            f"lr {config.optimizer.lr:g}")


def _shared_peak(config, rank: int) -> Peak:
    """The first rank's peak on every rank (measured once, not by every rank at the same time)."""
    peak = [None]
    if rank == 0:
        peak[0] = device_peak(config.logging.peak_tflops, config.model, config.schedule.micro_batch_size,
                              config.parallel.tensor_model_parallel_size)
    if dist.get_world_size() > 1:
        dist.broadcast_object_list(peak, src=0)
    return peak[0]


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
    """Console lines on rank 0 (with a redrawn progress line on a terminal), scalars to TensorBoard on the
    last rank (which holds the loss, as in Megatron) and to W&B on rank 0, and the run's status.json on rank 0."""

    def __init__(self, config, total_iters: int, start: int = 0, run_config: dict | None = None) -> None:
        self.total_iters = total_iters
        self.run_dir = config.run_dir
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        try:  # TensorBoard / W&B sinks of this rank (run_config: the W&B run's config); closed by close()
            self.trackers = open_trackers(config, self.rank, self.world, run_config or {})
        except OutputError as error:  # before the loop's `finally` exists: record the failure here
            if self.rank == 0:
                with contextlib.suppress(OutputError):
                    write_status(self.run_dir, "failed", start, total_iters,
                                 error=f"{type(error).__name__}: {error}"[:1000])
            raise
        self.peak = _shared_peak(config, self.rank)
        self.mfu_dropped = False
        self.flops_per_token = config.model.flops_per_token()
        self.progress = Progress(total_iters, desc="train", start=start, enabled=self.rank == 0)
        self.iteration = start
        if self.rank == 0:
            write_status(self.run_dir, "running", start, total_iters)
            print(f"MFU against a peak of {self.peak.tflops:.3g} TFLOP/s per device ({self.peak.describe()})", flush=True)
            print(f"MFU counts {self.flops_per_token:.4g} FLOPs per token by {FLOP_CONVENTION}", flush=True)

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        """Write scalars to TensorBoard (last rank) and W&B (rank 0, when configured)."""
        self.trackers.log(step, values)

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

    def mfu(self, tokens_per_s: float) -> float | None:
        """Model FLOPs utilisation over all ranks; None for the rest of the run once one was impossible.

        Every rank calls this at the same steps: the value is the maximum over ranks, so the console
        (first rank) and the scalar writers (last rank) drop MFU together.
        """
        if self.mfu_dropped:
            return None
        value = model_flops_utilization(self.flops_per_token, tokens_per_s, self.peak.tflops, self.world)
        if self.world > 1:
            device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
            agreed = torch.tensor([value], dtype=torch.float64, device=device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
            value = agreed.item()
        if plausible_mfu(value):
            return value
        self.mfu_dropped = True
        forgotten = self.rank == 0 and forget(self.peak)
        if self.peak.under_load:  # a peak timed on shared cores: the MFU is noise, not a fault worth a warning
            self.console(f"MFU not reported from here: its peak was {self.peak.under_load}, so it means little"
                         + ("; removed from the cache" if forgotten else "") + " (logging.peak_tflops sets one)")
            return None
        self.console(f"warning: MFU {100 * value:.3g}% is impossible, so the peak of {self.peak.tflops:.3g} TFLOP/s "
                     f"({self.peak.describe()}) is wrong: MFU is not reported for the rest of this run"
                     + ("; removed from the cache, the next run measures again" if forgotten else "")
                     + "; set logging.peak_tflops to the device's real peak")
        return None

    def eta(self) -> str:
        """Time left for the run at the average rate since (re)start."""
        eta = self.progress.eta_s
        return format_duration(eta) if eta is not None else "--:--:--"

    def close(self) -> None:
        """Flush TensorBoard/W&B and record the final state (failed when an exception is propagating)."""
        failure = propagating = sys.exc_info()[1]  # close() runs in the loop's `finally`
        try:
            self.trackers.close(failed=failure is not None)
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
