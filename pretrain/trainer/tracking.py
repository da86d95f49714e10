"""Where the run's scalars go: TensorBoard and, when `logging.wandb` is set, Weights & Biases, from one call.

`Trackers.log(step, values)` drops None and non-finite values once and hands the rest to every sink, so
both hold the same series. TensorBoard writes on the last rank (which holds the loss, as in Megatron);
W&B logs on rank 0 only (the loss, grad-norm and validation loss are reduced onto every rank; tokens/s,
step time and MFU are each rank's own clock, so across ranks they agree only closely).

W&B run identity: the first start in a run directory picks an id (run name + hash of the directory and the
creation time) and keeps it, with the last step it logged, in `<run>/wandb/run.json`. A requeued or resumed
run reads it back and calls `wandb.init(id=..., resume="allow")`, so the W&B run continues; steps up to the
last one already logged are recomputed by the resumed trainer but not logged again (W&B history steps must
increase, and a second row for a step would be a duplicate). `checkpoint.overwrite` clearing a damaged run
removes run.json, so the new run gets a new W&B run. Offline runs land in `<run>/wandb/offline-run-*`
(one directory per start): `wandb sync <run>/wandb/offline-run-*` uploads them to the one run. An online
start that fails (server unreachable, bad key) goes on offline, so no scalar is lost to a network problem.
"""

from __future__ import annotations

# Reaches into a library's internals (checked against tensorboard 2.20 and wandb 0.31):
# - the class name of tensorboard's event writer thread (_AsyncWriterThread): its write error is
#   handed to the main thread (reported as one line, see TensorBoardSink) and also re-raised in
#   the thread, whose traceback threading.excepthook would print; only that duplicate is dropped.
# - wandb's debug.log handlers on the "wandb" logger (wandb.sdk.lib.wb_logging.add_file_handler): after a
#   write fault they are closed, or every later wandb log line prints a "--- Logging error ---" traceback.

import contextlib
import hashlib
import json
import logging
import math
import netrc
import os
import re
import threading
import time
from pathlib import Path
from typing import Protocol

from pretrain.faults import OutputError, write_fault
from pretrain.trainer.run_dir import WANDB_STATE, run_output

WANDB_MIN_VERSION = (0, 17)
INSTALL_HINT = "pip install -e '.[wandb]' (or pip install 'wandb>=0.17')"


class Sink(Protocol):
    """One scalar destination."""

    def log(self, step: int, values: dict[str, float]) -> None: ...

    def close(self, failed: bool) -> None: ...


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


class TensorBoardSink:
    """TensorBoard event files in `log_dir`; a write fault (full disk, ...) is one OutputError naming it."""

    def __init__(self, run_dir: str | Path, log_dir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir, self.log_dir = run_dir, log_dir
        _drop_writer_thread_tracebacks()
        with self._guard():
            self.writer = SummaryWriter(log_dir=str(log_dir))

    def _guard(self):
        return run_output(self.run_dir, self.log_dir, "TensorBoard events",
                          elsewhere="pass --set logging.tensorboard_dir=<a directory on a larger disk>")

    def log(self, step: int, values: dict[str, float]) -> None:
        """Add each scalar at `step`."""
        with self._guard():
            for name, value in values.items():
                self.writer.add_scalar(name, value, step)
            self.writer.flush()  # a full disk shows at this step, not minutes later in a background thread

    def close(self, failed: bool) -> None:
        """Flush and close the event file."""
        with self._guard():
            self.writer.close()


def _has_api_key() -> bool:
    """Whether wandb would find credentials: WANDB_API_KEY / WANDB_IDENTITY_TOKEN_FILE, or a ~/.netrc
    (or $NETRC) entry for the W&B host (`wandb login` writes it)."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = re.sub(r"^https?://", "", os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).split("/")[0]
    try:
        entries = netrc.netrc(os.environ.get("NETRC") or Path.home() / ".netrc")
    except (OSError, netrc.NetrcParseError):
        return False
    found = entries.authenticators(host)
    return bool(found and found[2])


def resolve_mode(mode: str | None) -> str:
    """The W&B mode a run uses: the configured one, else $WANDB_MODE, else online with an API key, else offline."""
    if mode is not None:
        return mode
    env = os.environ.get("WANDB_MODE")
    if env in ("online", "offline", "disabled"):
        return env
    return "online" if _has_api_key() else "offline"


def check_wandb(settings) -> None:
    """Config-time check of `logging.wandb` (a WandbConfig): wandb installed and new enough, and an API key
    for mode online. Raises ValueError naming the fix, so a run never fails at its first log call."""
    from importlib import metadata

    try:
        version = metadata.version("wandb")
    except metadata.PackageNotFoundError:
        version = None
    try:  # also catches a wandb that is installed but cannot be imported
        import importlib.util

        importable = version is not None and importlib.util.find_spec("wandb") is not None
    except (ImportError, ValueError):
        importable = False
    if not importable:
        raise ValueError(f"logging.wandb is set but the wandb package is not installed; install it with "
                         f"{INSTALL_HINT}, or remove logging.wandb (or set logging.wandb.mode=disabled)")
    numbers = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    if numbers < WANDB_MIN_VERSION:
        raise ValueError(f"logging.wandb needs wandb >= {'.'.join(map(str, WANDB_MIN_VERSION))} (installed: "
                         f"{version}); upgrade with {INSTALL_HINT}")
    if resolve_mode(settings.mode) == "online" and not _has_api_key():
        source = "logging.wandb.mode=online" if settings.mode else "WANDB_MODE=online"
        raise ValueError(f"{source} but no W&B API key was found (WANDB_API_KEY, or ~/.netrc from `wandb login`); "
                         f"log in, or set logging.wandb.mode=offline and upload later with `wandb sync`")


def read_wandb_state(run_dir: str | Path) -> dict | None:
    """The run directory's W&B identity {id, last_step}, or None before the first W&B start."""
    try:
        state = json.loads((Path(run_dir) / WANDB_STATE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and isinstance(state.get("id"), str) else None


def _close_wandb_log_files() -> None:
    """After a write fault, stop wandb's debug.log handlers: each of its later log lines would otherwise print
    a "--- Logging error ---" traceback on stderr (the fault itself is reported once, as an OutputError)."""
    logger = logging.getLogger("wandb")
    for handler in list(logger.handlers):
        if isinstance(handler, logging.FileHandler):
            logger.removeHandler(handler)
            with contextlib.suppress(OSError):
                handler.close()


def _new_run_id(name: str, run_dir: Path) -> str:
    """W&B ids allow letters, digits, '-' and '_': the run name plus a hash of directory and start time."""
    digest = hashlib.sha256(f"{run_dir.resolve()}|{time.time_ns()}".encode()).hexdigest()[:10]
    return f"{re.sub(r'[^A-Za-z0-9_-]+', '-', name)[:48]}-{digest}"


class WandbSink:
    """One W&B run per run directory, continued across resumes; logs only steps above the last one logged."""

    def __init__(self, settings, run_dir: str | Path, name: str, config: dict) -> None:
        import wandb

        self.run_dir = Path(run_dir)
        self.state_path = self.run_dir / WANDB_STATE
        with self._guard():
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
        state = read_wandb_state(self.run_dir) or {"id": _new_run_id(name, self.run_dir), "last_step": 0}
        self.state = {"id": state["id"], "last_step": int(state.get("last_step", 0))}
        self._write_state()  # a full or read-only disk shows here, in one line, before wandb starts writing
        self.mode, self.note = resolve_mode(settings.mode), ""

        def start(mode: str):
            # console="off": wandb would otherwise rewrap stdout/stderr, which our progress line and the SLURM
            # logs own; silent: its banner lines would interleave with ours (describe() prints one line instead).
            return wandb.init(project=settings.project, entity=settings.entity, mode=mode, dir=str(self.run_dir),
                              id=self.state["id"], name=name, resume="allow", config=config,
                              settings=wandb.Settings(console="off", silent=True))  # $WANDB_INIT_TIMEOUT: 90 s

        try:
            with self._guard():
                self.run = start(self.mode)
        except OutputError:
            raise
        except Exception as error:  # noqa: BLE001 - server unreachable, bad key, ...: keep the data locally
            if self.mode != "online":
                raise
            reason = " ".join(f"{type(error).__name__}: {error}".split())
            self.mode, self.note = "offline", f" (online start failed: {reason[:250]})"
            wandb.teardown()  # the failed start still holds the run id in wandb's service process
            with self._guard():
                self.run = start("offline")
        # Online, the server knows the resumed run's history (run.step is its next step); offline only run.json does.
        self.floor = max(self.state["last_step"], int(self.run.step or 0) - 1)

    def describe(self) -> str:
        """One console line: where the run's W&B data goes."""
        if self.mode == "offline":
            return (f"W&B: offline run {self.state['id']} in {self.run_dir / 'wandb'}{self.note}; upload with "
                    f"`wandb sync {self.run_dir / 'wandb'}/offline-run-*`")
        return f"W&B: run {self.state['id']} at {self.run.url}"

    def log(self, step: int, values: dict[str, float]) -> None:
        """Log at `step` unless an earlier start of this run already logged it."""
        if step <= self.floor:
            return
        with self._guard():
            self.run.log(values, step=step)
        if step > self.state["last_step"]:
            self.state["last_step"] = step
            self._write_state()

    @contextlib.contextmanager
    def _guard(self):
        """Write faults in our process (wandb's own files, run.json) become one OutputError naming the fix."""
        try:
            with run_output(self.run_dir, self.state_path.parent, "W&B files"):
                yield
        except OutputError:
            _close_wandb_log_files()
            raise

    def _write_state(self) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        try:
            with self._guard():
                tmp.write_text(json.dumps(self.state))
                os.replace(tmp, self.state_path)
        finally:
            with contextlib.suppress(OSError):  # nothing half-written stays behind
                tmp.unlink(missing_ok=True)

    def close(self, failed: bool) -> None:
        """Finish the run (marked failed in W&B when the trainer is stopping on an exception)."""
        with self._guard():
            self.run.finish(exit_code=1 if failed else 0)


class Trackers:
    """The sinks of one rank behind one call: every finite scalar reaches each of them."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks
        self.last_step = -1

    def log(self, step: int, values: dict[str, float | None]) -> None:
        """Write the finite values among `values` at `step` to every sink."""
        finite = {name: float(value) for name, value in values.items()
                  if value is not None and math.isfinite(value)}
        if finite and step >= self.last_step:  # W&B drops (with a warning) any step below its current one
            self.last_step = step
            for sink in self.sinks:
                sink.log(step, finite)

    def close(self, failed: bool = False) -> None:
        """Close every sink (each one even if another fails)."""
        errors = []
        for sink in self.sinks:
            try:
                sink.close(failed)
            except Exception as error:  # noqa: BLE001 - close the rest, then re-raise the first
                errors.append(error)
        if errors:
            raise errors[0]


def open_trackers(config, rank: int, world: int, resolved: dict) -> Trackers:
    """TensorBoard on the last rank, W&B on rank 0 when `logging.wandb` is enabled (`resolved`: its run config)."""
    sinks: list[Sink] = []
    if rank == world - 1:
        sinks.append(TensorBoardSink(config.run_dir, config.logging.tensorboard_dir or config.run_dir / "tensorboard"))
    wandb_settings = config.logging.wandb
    if rank == 0 and wandb_settings is not None and resolve_mode(wandb_settings.mode) != "disabled":
        sink = WandbSink(wandb_settings, config.run_dir, config.name, resolved)
        print(sink.describe(), flush=True)
        sinks.append(sink)
    return Trackers(sinks)
