"""What a user sees on the console: known-harmless library warnings silenced in one place,
one line per event, and a progress line with ETA that redraws on a terminal and falls back
to plain periodic lines when output goes to a file (SLURM logs, pipes, CI).

`quiet_known_warnings()` is installed first thing by `python -m pretrain` and `python -m
data_prep`. Each entry of `KNOWN_HARMLESS` matches one exact message (and the module that
issues it) and says why it is harmless; `KNOWN_HARMLESS_LOG_LINES` does the same for library
log lines at WARNING; every other warning still shows.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Iterable, Iterator, TextIO, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class KnownWarning:
    """One library warning we know to be harmless here, and why."""

    category: type[Warning]
    message: str  # regex matched against the start of the message
    module: str  # regex matched against the module the warning is attributed to
    reason: str


KNOWN_HARMLESS = (
    KnownWarning(UserWarning, r"Transformer Engine and Apex are not installed\. Falling back to", r"megatron\.core\.",
                 "CPU and plain-PyTorch installs use Megatron's torch fallbacks on purpose; "
                 "`python -m pretrain selfcheck` reports which of TE/Apex are installed"),
    KnownWarning(UserWarning, r"Apex is not installed\. Falling back to Torch Norm", r"megatron\.core\.",
                 "Apex is optional; the torch RMSNorm is what the local spec uses on CPU"),
    KnownWarning(UserWarning, r"full scope is deprecated\. Use empty cuda_graph_",
                 r"megatron\.core\.transformer",
                 "Megatron-Core's own default (0.16: cuda_graph_scope='full'; 0.19: its migration to "
                 "cuda_graph_modules) triggers it; we use no CUDA graphs"),
    KnownWarning(UserWarning, r"MimoModelConfig is experimental", r"megatron\.core\.models\.mimo",
                 "Megatron-Core 0.19's package imports define its multimodal config class; we never use it"),
    KnownWarning(UserWarning, r"Could not determine rank from torch\.distributed, RANK, or SLURM_PROCID",
                 r"megatron\.core\._rank_utils",
                 "Megatron-Core 0.19 asks for a rank where data_prep writes shards outside any process group; "
                 "rank 0 is right there"),
    KnownWarning(UserWarning, r"torch\.distributed is disabled, unavailable or uninitialized, assuming the intent "
                 r"is to load in a single process", r"torch\.distributed\.checkpoint",
                 "Megatron-Core 0.19 loads a checkpoint through torch.distributed.checkpoint in one-process runs, "
                 "evaluation and export, where no process group exists; a single-process load is what is meant"),
    KnownWarning(UserWarning, r"The argument order of load has been changed", r"torch\.distributed\.checkpoint",
                 "Megatron-Core 0.19 calls torch.distributed.checkpoint.load with its arguments by keyword order "
                 "of an older torch; the call is Megatron's, the load is correct (resume tests compare losses)"),
    KnownWarning(FutureWarning, r"Please use DTensor instead and we are deprecating ShardedTensor",
                 r"(megatron\.core\.|megatron_ext\.cpu_compat|torch\.distributed)",
                 "Megatron-Core 0.16's dist_checkpointing is built on ShardedTensor; nothing to change on our side"),
    KnownWarning(FutureWarning, r"`load_state_dict` is deprecated and will be removed in future versions\. "
                 r"Please use `load` instead", r"megatron\.core\.dist_checkpointing",
                 "Megatron-Core 0.16 calls torch.distributed.checkpoint.load_state_dict itself"),
    KnownWarning(FutureWarning, r"`torch\.distributed\.all_gather_into_tensor` is deprecated", r"torch\.distributed",
                 "Megatron-Core's distributed optimizer all-gathers params with it (0.16.1); the call is Megatron's "
                 "and still correct (tests/trainer/test_distributed_optimizer.py)"),
    KnownWarning(FutureWarning, r"`torch\.distributed\.reduce_scatter_tensor` is deprecated", r"torch\.distributed",
                 "Megatron-Core's distributed optimizer reduce-scatters grads with it (0.16.1); the call is Megatron's "
                 "and still correct (tests/trainer/test_distributed_optimizer.py)"),
    KnownWarning(UserWarning, r"The \.grad attribute of a Tensor that is not a leaf Tensor is being accessed",
                 r"(megatron\.core\.optimizer|megatron_ext\.cpu_compat)",
                 "Megatron-Core's distributed optimizer zeroes the grads of its fp32 shard views (non-leaf by design; "
                 "0.16.1 distrib_optimizer.zero_grad notes 'throws grad-access warning'); on CPU it is attributed to "
                 "cpu_compat's device mode, which only forwards the call; the grads Megatron uses are main_grad"),
    KnownWarning(UserWarning, r"The pad token id in the tokenizer collides with another special token id\..*"
                 r"As such, the training flow will avoid masking out any pad tokens", r"megatron\.core\.datasets",
                 "our shards have no pad token (pad = EOD is only a placeholder); Megatron then masks nothing, "
                 "which is what packed pretraining wants"),
)

@dataclass(frozen=True)
class KnownLogLine:
    """One library log line at WARNING or above that we know to be harmless here, and why."""

    logger: str
    message: str  # regex matched against the start of the message
    reason: str


KNOWN_HARMLESS_LOG_LINES = (
    KnownLogLine("megatron.core.models.gpt.gpt_model", r"GPTModel IS DEPRECATED",
                 "Megatron-Core 0.19 points new work to HybridModel; GPTModel is its supported dense decoder "
                 "through 0.19, and the one this project's RoPE hook subclasses"),
    KnownLogLine("megatron.core.dist_checkpointing.strategies.torch", r"MCore's async save is deprecated",
                 "Megatron-Core 0.19 routes every torch_dist save through its async path and logs this once; our "
                 "saves are synchronous (pretrain/trainer/checkpoint.py), and NVRx is not installed here"),
)


class _DropKnownLines(logging.Filter):
    """Drops the KNOWN_HARMLESS_LOG_LINES of one logger."""

    def __init__(self, patterns: list[str]) -> None:
        super().__init__()
        self.patterns = [re.compile(pattern) for pattern in patterns]

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not any(pattern.match(message) for pattern in self.patterns)


# Megatron loggers that repeat per run at INFO what the console line already says.
QUIET_LOGGERS = {
    "megatron.core.datasets": "GPTDataset builds/caches indices per split: one block of lines per run",
    "megatron.core.dist_checkpointing": "strategy and validation chatter on every save/load",
    "megatron.core.optimizer": "optimizer construction details",
    "megatron.core.distributed": "DDP bucket layout per model",
}

_installed = False


def quiet_known_warnings() -> None:
    """Silence exactly the warnings in KNOWN_HARMLESS and the chatter of QUIET_LOGGERS (idempotent)."""
    global _installed
    if _installed or os.environ.get("PRETRAIN_SHOW_ALL_WARNINGS"):
        return
    for known in KNOWN_HARMLESS:
        warnings.filterwarnings("ignore", message=known.message, category=known.category, module=known.module)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in sorted({known.logger for known in KNOWN_HARMLESS_LOG_LINES}):
        logging.getLogger(name).addFilter(
            _DropKnownLines([known.message for known in KNOWN_HARMLESS_LOG_LINES if known.logger == name]))
    _installed = True


def is_terminal(stream: TextIO | None = None) -> bool:
    """True when `stream` (stdout by default) is an interactive terminal."""
    stream = stream or sys.stdout
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


def format_duration(seconds: float) -> str:
    """HH:MM:SS (no days: long runs show e.g. 53:10:00)."""
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """Progress over `total` items with ETA.

    On a terminal: one line redrawn in place (a bar, the rate, the ETA and a caller's
    postfix); `write()` prints a persistent line above it. Elsewhere: nothing is redrawn;
    a plain line is printed every `every_s` seconds (and a last one at the end if any was),
    so a SLURM log gets a heartbeat without control characters and short loops stay silent.
    """

    def __init__(self, total: int, *, desc: str = "", start: int = 0, stream: TextIO | None = None,
                 terminal: bool | None = None, every_s: float = 60.0, enabled: bool = True) -> None:
        self.total, self.done, self.desc = max(int(total), 0), int(start), desc
        self.stream = stream or sys.stdout
        self.terminal = is_terminal(self.stream) if terminal is None else terminal
        self.every_s, self.enabled = every_s, enabled
        self._start_time, self._start_done = time.monotonic(), self.done
        self._last_draw = 0.0
        self._drawn = False
        self.postfix = ""

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the average rate since start (None before the first item)."""
        elapsed, advanced = time.monotonic() - self._start_time, self.done - self._start_done
        return None if advanced <= 0 else elapsed / advanced * (self.total - self.done)

    def line(self) -> str:
        """The progress text (without control characters)."""
        fraction = self.done / self.total if self.total else 1.0
        eta = self.eta_s
        head = f"{self.desc} " if self.desc else ""
        bar = ""
        if self.terminal:
            width = 20
            filled = int(round(fraction * width))
            bar = "[" + "#" * filled + "." * (width - filled) + "] "
        tail = f" | {self.postfix}" if self.postfix else ""
        return (f"{head}{bar}{self.done}/{self.total} ({fraction:.0%}){tail}"
                f" | ETA {format_duration(eta) if eta is not None else '--:--:--'}")

    def update(self, done: int | None = None, postfix: str | None = None) -> None:
        """Advance to `done` (or by one) and redraw when due."""
        self.done = self.done + 1 if done is None else int(done)
        if postfix is not None:
            self.postfix = postfix
        if not self.enabled:
            return
        now = time.monotonic()
        finished = self.done >= self.total
        if self.terminal:
            if now - self._last_draw >= 0.2 or finished:
                self._draw()
        elif now - (self._last_draw or self._start_time) >= self.every_s or (finished and self._last_draw):
            # short loops stay silent in logs; long ones get a line every every_s and a last one
            self._last_draw = now
            print(self.line(), file=self.stream, flush=True)

    def write(self, text: str) -> None:
        """A persistent line; the redrawn progress line (terminal) comes back below it."""
        if not self.enabled:
            print(text, file=self.stream, flush=True)
            return
        if self.terminal and self._drawn:
            self.stream.write("\r\033[K")
        print(text, file=self.stream, flush=True)
        if self.terminal and self._drawn:
            self._draw()

    def _draw(self) -> None:
        self._last_draw = time.monotonic()
        self.stream.write("\r\033[K" + self.line())
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Leave the terminal on a fresh line."""
        if self.terminal and self._drawn and self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._drawn = False


def progress(items: Iterable[T], total: int | None = None, *, desc: str = "", enabled: bool = True,
             stream: TextIO | None = None) -> Iterator[T]:
    """Iterate `items` with a Progress line on `stream` (stderr by default)."""
    items = list(items) if total is None and not hasattr(items, "__len__") else items
    bar = Progress(len(items) if total is None else total, desc=desc, stream=stream or sys.stderr, enabled=enabled)
    try:
        for item in items:
            yield item
            bar.update()
    finally:
        bar.close()
