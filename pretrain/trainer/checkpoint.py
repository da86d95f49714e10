"""Megatron-Core distributed checkpoints: atomic verified save, keep-last-K, resume under any TP/PP.

The run directory's files belong to `pretrain.trainer.run_dir` (layout, verification, resume) and
`pretrain.trainer.run_commit` (commit, pruning, a failed save's clean-up); this module writes and reads Megatron's state into them.

A save goes to `iter_N.tmp` and is renamed when every rank has finished writing and
train_state.json records the size and checksum of each file, so a crash mid-save leaves the
previous checkpoints untouched. Which checkpoint is intact, and which one a run resumes from,
is decided in `pretrain.trainer.run_dir` (re-exported here). Weights holding NaN/inf are never saved.
"""

from __future__ import annotations

import json
import logging
import pickle
import random
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, ContextManager

import numpy
import torch
import torch.distributed as dist

from pretrain.faults import probe_fault, write_fault
from pretrain.trainer import children, precision_resume
from pretrain.trainer.run_commit import (commit_checkpoint, failed_save_error, partial_dir,  # noqa: F401
                                         remove_partials, start_partial)
from pretrain.trainer.run_dir import (LATEST, MOVE_RUN, STATE, CheckpointError,  # noqa: F401 (re-exported)
                                      DamagedCheckpointError, Resume, any_rank, checkpoints, file_record,
                                      iteration_dir, latest_iteration, on_rank0, plan_resume, rank as _rank,
                                      read_train_state, resolve, resume_hint, run_output, set_aside_newer, verify)

# Megatron's checkpoint helper processes (results-queue Manager, forked writers) are started shielded
# from the job's stop signals and tied to the trainer's life in pretrain.trainer.children.

class _ReportedBySave(logging.Filter):
    """Drops Megatron's log line for a failed checkpoint writer: save() raises it as one clear error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Local process ")


logging.getLogger("megatron.core.dist_checkpointing.strategies.filesystem_async").addFilter(_ReportedBySave())

RNG_FORMAT = 2  # before: random/numpy getstate() tuples (numpy arrays need Megatron's safe globals)
log = logging.getLogger("pretrain.checkpoint")


class NonFiniteWeightsError(RuntimeError):
    """The model holds NaN/inf weights: such a state is never written as a checkpoint."""


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


# ------------------------------------------------------------------------------ RNG states


def _rng_state() -> dict:
    """Every RNG stream as tensors and numbers, so the file loads with weights_only=True."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = numpy.random.get_state()
    return {"format": RNG_FORMAT,
            "python": {"version": py_version, "state": torch.tensor(py_state, dtype=torch.int64),
                       "gauss_next": py_gauss},
            "numpy": {"name": np_name, "keys": torch.from_numpy(np_keys.astype(numpy.int64)), "pos": int(np_pos),
                      "has_gauss": int(np_has_gauss), "cached_gaussian": float(np_gauss)},
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
            "tracker": dict(get_cuda_rng_tracker().get_states())}


def _set_rng_state(state: dict) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    py, np_ = state["python"], state["numpy"]
    if state.get("format") == RNG_FORMAT:
        py = (py["version"], tuple(py["state"].tolist()), py["gauss_next"])
        np_ = (np_["name"], np_["keys"].numpy().astype(numpy.uint32), np_["pos"], np_["has_gauss"],
               np_["cached_gaussian"])
    # else a file saved before RNG_FORMAT: the getstate() tuples themselves, which weights_only loads
    # accept through the numpy globals megatron.core registers as safe (megatron/core/safe_globals.py)
    random.setstate(py)
    numpy.random.set_state(np_)
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    get_cuda_rng_tracker().set_states(state["tracker"])


def _restore_rng(rng_file: Path) -> None:
    """Restore this rank's RNG streams; a file the weights_only loader refuses is never unpickled."""
    try:
        state = torch.load(rng_file, weights_only=True)
    except pickle.UnpicklingError as refused:
        if _rank() == 0:
            reason = str(refused).split("WeightsUnpickler error: ")[-1].splitlines()[0]
            log.warning(f"{rng_file} holds objects a weights_only load refuses ({reason}); not unpickling it: RNG "
                        "streams continue from the seed, model and optimizer are restored")
        return
    except (OSError, RuntimeError, EOFError) as error:
        raise DamagedCheckpointError(f"{rng_file} is unreadable ({type(error).__name__}: {error})") from None
    _set_rng_state(state)


# ------------------------------------------------------------------------------ save / load


def _layout() -> dict:
    from megatron.core import parallel_state as ps

    return {"world_size": dist.get_world_size(), "tp": ps.get_tensor_model_parallel_world_size(),
            "pp": ps.get_pipeline_model_parallel_world_size()}


def _optimizer_metadata(engine) -> dict:
    """How the distributed optimizer shards its state: 'fully_reshardable' so any TP/PP/DP can resume
    (Megatron's default flattened layout cannot be written by the torch_dist backend)."""
    if engine.parallel.use_distributed_optimizer:
        return {"distrib_optim_sharding_type": "fully_reshardable"}
    return {}


def weights_finite(modules: list[torch.nn.Module]) -> bool:
    """Collective: True when no rank's parameters (of any of `modules`) hold NaN or inf."""
    checks = [torch.isfinite(p).all() for module in modules for p in module.parameters()]
    local = bool(torch.stack(checks).all()) if checks else True  # one device sync, not one per tensor
    return not any_rank(not local)


def _files_record(tmp: Path) -> dict:
    """Collective: size + sha256 of every file in `tmp`, hashed by all ranks in turn."""
    names = [sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())] if _rank() == 0 else [None]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(names, src=0)
        world = dist.get_world_size()
    else:
        world = 1
    mine = {name: file_record(tmp / name) for name in names[0][_rank()::world]}
    parts = [mine]
    if world > 1:
        parts = [None] * world
        dist.all_gather_object(parts, mine)
    return {name: part[name] for part in parts for name in part}


def save(run_dir: str | Path, iteration: int, engine, train_state: dict, keep_last: int, *,
         run_dir_exists: bool = False, commit_guard: Callable[[], ContextManager] | None = None) -> Path:
    """Collective: write checkpoint `iteration` atomically, then prune to the newest `keep_last`.

    A write fault on any rank (full disk, read-only or removed run directory) raises one
    CheckpointSaveError on every rank, after the partial iter_N.tmp is removed. With
    `run_dir_exists` (a training run, which made it) a vanished run directory is not recreated.
    The commit (train_state.json, the rename, the LATEST hint, pruning) runs inside `commit_guard()`: the stop
    signal handler's way to tell a save not committed yet (a second Ctrl-C abandons it) from one committing or
    complete (it no longer interrupts, so no rename or pruning is cut short)."""
    from megatron.core import dist_checkpointing

    children.start_checkpoint_helpers()

    run_dir = Path(run_dir)
    final, tmp = iteration_dir(run_dir, iteration), partial_dir(run_dir, iteration)
    if final.exists():  # on every rank, so none waits at a barrier for a failed one
        raise CheckpointError(f"{final} already exists and belongs to another run history; not replacing it: "
                              "pass --set checkpoint.save=<new run dir>")
    if not weights_finite(engine.chunks):
        raise NonFiniteWeightsError(f"the weights at iteration {iteration} hold NaN or inf: not saving them; "
                                    f"the checkpoints in {run_dir} are untouched")

    def make_tmp() -> None:
        if _rank() == 0:
            start_partial(run_dir, iteration, make_run_dir=not run_dir_exists)

    def write_shards() -> None:
        model_state = engine.sharded_state_dict()
        state = {"model": model_state,
                 "optimizer": engine.optimizer.sharded_state_dict(model_state, metadata=_optimizer_metadata(engine))}
        dist_checkpointing.save(state, str(tmp))
        (tmp / "rng").mkdir(exist_ok=True)
        torch.save(_rng_state(), tmp / "rng" / f"rank_{_rank():05d}.pt")

    def commit() -> None:
        # (not a signal mask: a signal reaches the process through any thread that does not block it, and Python
        # runs its handler in the main thread whatever the main thread's mask says)
        with commit_guard() if commit_guard is not None else nullcontext():
            if _rank() == 0:
                record = dict(train_state, iteration=iteration, scheduler=engine.scheduler.state_dict(),
                              layout=_layout(), use_distributed_optimizer=engine.parallel.use_distributed_optimizer,
                              files=files)
                commit_checkpoint(run_dir, iteration, record, keep_last)

    _on_every_rank(make_tmp, run_dir, iteration)
    _barrier()
    _on_every_rank(write_shards, run_dir, iteration)
    _barrier()
    files: dict = {}
    _on_every_rank(lambda: files.update(_files_record(tmp)), run_dir, iteration)
    _on_every_rank(commit, run_dir, iteration)
    _barrier()
    return final


class CheckpointSaveError(CheckpointError):
    """A checkpoint could not be written: full disk, read-only or removed run directory."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.errno = code  # the write fault, for callers that re-describe it (import-hf)


def _on_every_rank(step, run_dir: Path, iteration: int) -> None:
    """Collective: run `step` on every rank; a write fault on any rank raises one CheckpointSaveError on all.

    Megatron's save raises on every rank when any rank's writer failed, but only the coordinator's
    exception names the failure, hence the agreement; other errors propagate as they are."""
    from torch.distributed.checkpoint.api import CheckpointException

    error, code = None, None
    try:
        step()
    except (Exception, CheckpointException) as caught:  # (torch's CheckpointException is a BaseException)
        # torch's zip writer reports a full disk without an errno ("unexpected pos"): then the disk is asked
        tmp = partial_dir(run_dir, iteration)
        code = write_fault(caught) or (probe_fault(tmp if tmp.is_dir() else run_dir)
                                       if isinstance(caught, (OSError, RuntimeError, CheckpointException)) else None)
        if code is None and not isinstance(caught, CheckpointException):
            raise
        error = caught
    if not any_rank(error is not None):
        return
    codes = torch.tensor([float(code or 0)])
    if dist.is_initialized():
        dist.all_reduce(codes, op=dist.ReduceOp.MAX)
    if not codes.item():  # no rank saw a write fault: not ours to explain
        if error is not None:
            raise error
        raise CheckpointError(f"checkpoint {iteration} could not be saved: another rank failed (see its error)")
    message = [None]
    if _rank() == 0:
        message = [str(failed_save_error(run_dir, iteration, int(codes.item())))]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(message, src=0)
    raise CheckpointSaveError(message[0], int(codes.item())) from None


def _read(request: dict, path: Path) -> dict:
    """dist_checkpointing.load, its failures on damaged files turned into one DamagedCheckpointError."""
    from megatron.core import dist_checkpointing

    try:
        return dist_checkpointing.load(request, str(path))
    except Exception as error:  # torch/Megatron raise many types for a truncated or missing file
        detail = str(error).splitlines()[0] if str(error).strip() else "no detail"
        raise DamagedCheckpointError(f"checkpoint {path} cannot be read ({type(error).__name__}: {detail}): its "
                                     "files are damaged, or it was saved with another model config") from None


def load(checkpoint: str | Path, engine, *, load_optimizer: bool = True) -> dict:
    """Collective: load model (+ optimizer, scheduler, RNG) into `engine` under its current TP/PP."""
    path = resolve(checkpoint)
    record = json.loads((path / STATE).read_text())
    model_state = engine.sharded_state_dict()
    request = {"model": model_state}
    if load_optimizer:
        saved_with = record.get("use_distributed_optimizer", False)
        if saved_with != engine.parallel.use_distributed_optimizer:
            raise CheckpointError(
                f"{path} was saved with parallel.use_distributed_optimizer={str(saved_with).lower()}; resume with the "
                "same setting, or start a new run from its weights with checkpoint.load=<that checkpoint>")
        engine.prepare_optimizer_load()
        request["optimizer"] = precision_resume.optimizer_request(
            engine, engine.optimizer.sharded_state_dict(model_state, is_loading=True,
                                                        metadata=_optimizer_metadata(engine)), record)
    loaded = _read(request, path)
    engine.load_state_dict(loaded["model"])
    if not load_optimizer:
        # bf16 and the distributed optimizer step fp32 main copies made from the weights at build time:
        # without this the first step would write the build-time weights back over the loaded ones.
        engine.optimizer.reload_model_params()
    else:
        engine.load_optimizer_state(precision_resume.loaded_optimizer_state(engine, loaded["optimizer"], record))
        engine.scheduler.load_state_dict(record["scheduler"])
        rng_file = path / "rng" / f"rank_{_rank():05d}.pt"
        # RNG streams are per rank: only meaningful when the layout is the one that saved them.
        if record.get("layout") == _layout() and rng_file.is_file():
            _restore_rng(rng_file)
    precision_resume.load_weights(engine, record, lambda request: _read(request, path))
    return record


def load_newest(resume: Resume, engine) -> tuple[Path, dict, list[str]]:
    """Collective: load the newest candidate that every rank can read; (its path, train state, notes)."""
    notes = []
    for path in resume.candidates:
        try:
            record, error = load(path, engine), None
        except DamagedCheckpointError as damaged:
            record, error = None, str(damaged)
        if not any_rank(error is not None):
            return path, record, notes
        notes.append(f"skipping {path}: {error or 'another rank could not read it'}")
    raise CheckpointError(f"no checkpoint in {resume.candidates[0].parent} loads ({'; '.join(notes)}); if the "
                          "model config changed, pass --set checkpoint.save=<new run dir> (and checkpoint.load=<one "
                          "of them> to start from its weights)")


def load_model_weights(checkpoint: str | Path, model) -> dict:
    """Load only the model weights of a checkpoint into a bare FloatPositionGPTModel (any TP/PP saved)."""
    path = resolve(checkpoint)
    loaded = _read({"model": model.sharded_state_dict()}, path)
    model.load_state_dict(loaded["model"])
    return json.loads((path / STATE).read_text())
