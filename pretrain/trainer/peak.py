"""The device peak FLOP/s that MFU is measured against, and where it came from.

In order: `logging.peak_tflops` from the config; PEAK_TFLOPS for known GPUs; else a matmul
measurement at the model's own GEMM shapes and dtype (several timed repeats per shape, the
median of each, the best shape), cached per machine in `~/.cache/posaug/peak_flops.json`
under hostname, CPU/GPU model, torch version, dtype, threads and shapes, with the date and
load average it was measured under. A single short measurement under a passing load made
CPU MFU noise that looked like a number (98.6 % in one demo run); the median of repeats is
stable, and the cache makes every run of a machine use the same peak. A peak shown wrong
(MFU above 100 %) is removed from the cache by `forget`, so the next run measures again.
A CPU peak timed with more runnable processes than cores (load average >= cores) shared its cores: it
comes out low, so an impossible MFU against it says nothing about the run (`Peak.under_load` names it, and
the trainer then drops MFU with a note instead of a warning).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import socket
import statistics
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

# Dense BF16 peak per device (TFLOP/s), for the MFU estimate.
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "V100": 125.0}
CACHE_FILE = "peak_flops.json"
REPEATS = 7
REPEAT_S = 0.02  # each timed repeat runs the product enough times to last this long
SHAPE_BUDGET_S = 1.0  # past this, a shape stops after 3 repeats
MAX_PRODUCT_FLOP = 4e9  # rows are capped so one product stays below this: the rate saturates well before


@dataclass(frozen=True)
class Peak:
    """A device's peak TFLOP/s and its provenance."""

    tflops: float
    source: str  # config | table | measured now | cached
    detail: str = ""  # what was measured, or which table entry
    measured_at: str | None = None  # ISO time of the measurement (measured / cached)
    key: str | None = None  # the cache key (measured / cached)
    under_load: str | None = None  # a CPU peak timed on shared cores: why it means little, else None

    def describe(self) -> str:
        """Where the peak came from, for the console."""
        if self.source == "config":
            return "from the config: logging.peak_tflops"
        if self.source == "table":
            return f"table entry for {self.detail}"
        if self.source == "cached":
            return f"cached from {self.measured_at}: {self.detail}"
        return f"measured now: {self.detail}"


def cache_dir() -> Path:
    """$POSAUG_CACHE_DIR, else $XDG_CACHE_HOME/posaug, else ~/.cache/posaug."""
    if os.environ.get("POSAUG_CACHE_DIR"):
        return Path(os.environ["POSAUG_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "posaug"


def known_peak_tflops() -> float | None:
    """The table's peak for this process's GPU, if it is a known one."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((peak for key, peak in PEAK_TFLOPS.items() if key in name), None)


def model_shapes(model, micro_batch_size: int = 1, tensor_parallel: int = 1) -> list[tuple[int, int, int]]:
    """(rows, inner, cols) of the model's largest GEMMs on one device: fc1, fc2 and the output layer."""
    h, ffn = model.hidden_size, model.ffn_hidden_size // tensor_parallel
    vocab = model.padded_vocab_size(tensor_parallel) // tensor_parallel
    tokens = micro_batch_size * model.seq_length
    shapes = []
    for inner, cols in ((h, ffn), (ffn, h), (h, vocab)):
        rows = max(1, min(tokens, int(MAX_PRODUCT_FLOP // (2 * inner * cols))))
        shapes.append((rows, inner, cols))
    return shapes


def measure_matmul_tflops(shapes: list[tuple[int, int, int]], dtype: torch.dtype = torch.float32,
                          device: str = "cpu", repeats: int = REPEATS) -> tuple[float, int]:
    """(best over `shapes` of the median matmul TFLOP/s over timed repeats, fewest repeats of a shape)."""
    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    best, fewest = 0.0, repeats
    for rows, inner, cols in shapes:
        a = torch.randn(rows, inner, device=device, dtype=dtype)
        b = torch.randn(inner, cols, device=device, dtype=dtype)
        for _ in range(2):  # warm-up: thread pool, kernel selection
            torch.matmul(a, b)
        sync()
        start = time.perf_counter()
        torch.matmul(a, b)
        sync()
        calls = max(1, int(REPEAT_S / max(time.perf_counter() - start, 1e-9)))
        rates, deadline = [], time.perf_counter() + SHAPE_BUDGET_S
        for _ in range(repeats):
            if len(rates) >= 3 and time.perf_counter() > deadline:
                break  # a loaded machine: the median of fewer repeats, rather than minutes of measuring
            start = time.perf_counter()
            for _ in range(calls):
                torch.matmul(a, b)
            sync()
            rates.append(2 * rows * inner * cols * calls / max(time.perf_counter() - start, 1e-9) / 1e12)
        best, fewest = max(best, statistics.median(rates)), min(fewest, len(rates))
    return best, fewest


def processor() -> str:
    """The GPU's name, else the CPU's model name."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def cache_key(dtype: torch.dtype, shapes: list[tuple[int, int, int]]) -> str:
    """What a measured peak depends on: machine, processor, torch, dtype, threads, shapes."""
    threads = "cuda" if torch.cuda.is_available() else f"{torch.get_num_threads()} threads"
    return " | ".join([socket.gethostname(), processor(), f"torch {torch.__version__}", _dtype_name(dtype),
                       threads, " ".join("x".join(map(str, shape)) for shape in shapes)])


def _read_cache(path: Path) -> dict:
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # missing or damaged: measured again and rewritten
    return cache if isinstance(cache, dict) else {}


def _write_cache(path: Path, cache: dict) -> str | None:
    """Replace the cache file atomically; the reason when it cannot be written (the run goes on uncached)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, path)
    except OSError as error:  # read-only or full home: costs one measurement per run, said on the peak line
        with contextlib.suppress(OSError):
            tmp.unlink()
        return f"{error.strerror or error} ({path})"
    return None


def shared_cores(load: object, device: str) -> str | None:
    """Why a matmul timing on `device` under this load average means little (CPU cores shared), else None."""
    cores = os.cpu_count() or 1
    if device == "cpu" and isinstance(load, (int, float)) and load >= cores:  # NaN compares False
        return f"timed at load average {load:.1f} on {cores} cores"
    return None


def measured_peak(dtype: torch.dtype, shapes: list[tuple[int, int, int]], directory: Path | None = None) -> Peak:
    """The cached measurement for this machine and these shapes, else a fresh one (then cached)."""
    path = (directory or cache_dir()) / CACHE_FILE
    key = cache_key(dtype, shapes)
    entry = _read_cache(path).get(key)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if isinstance(entry, dict) and isinstance(entry.get("tflops"), (int, float)) and entry["tflops"] > 0:
        return Peak(float(entry["tflops"]), "cached", entry.get("detail", ""), entry.get("measured_at"), key,
                    shared_cores(entry.get("load_average"), device))
    tflops, repeats = measure_matmul_tflops(shapes, dtype, device)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    threads = "" if device == "cuda" else f"{torch.get_num_threads()}-thread "
    detail = (f"{threads}{_dtype_name(dtype)} matmul at the model's shapes, median of {repeats} repeats, "
              f"load average {load:.1f} on {os.cpu_count()} cores")
    measured_at = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cache = _read_cache(path)
    cache[key] = {"tflops": tflops, "measured_at": measured_at, "load_average": load, "detail": detail}
    not_cached = _write_cache(path, cache)
    return Peak(tflops, "measured now", detail + (f"; not cached: {not_cached}" if not_cached else ""), measured_at,
                None if not_cached else key, shared_cores(load, device))


def forget(peak: Peak, directory: Path | None = None) -> bool:
    """Remove a measured peak from the cache (it was shown wrong); True when an entry was removed."""
    if peak.key is None:
        return False
    path = (directory or cache_dir()) / CACHE_FILE
    cache = _read_cache(path)
    if cache.pop(peak.key, None) is None:
        return False
    _write_cache(path, cache)
    return True


def device_peak(configured: float | None, model, micro_batch_size: int = 1, tensor_parallel: int = 1,
                directory: Path | None = None) -> Peak:
    """The peak of this process's device for `model`: config, table of known GPUs, or measured (cached)."""
    if configured:
        return Peak(float(configured), "config")
    known = known_peak_tflops()
    if known:
        return Peak(known, "table", torch.cuda.get_device_name())
    dtype = torch.bfloat16 if model.bf16 else torch.float32
    return measured_peak(dtype, model_shapes(model, micro_batch_size, tensor_parallel), directory)


def plausible_mfu(mfu: float) -> bool:
    """False for an MFU no device can reach (above 100 %, negative, NaN): the peak is wrong."""
    return 0.0 <= mfu <= 1.0
