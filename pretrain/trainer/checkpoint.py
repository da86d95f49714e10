"""Megatron-Core distributed checkpoints: atomic save, keep-last-K, resume under any TP/PP.

Layout of a run directory:

    <save>/config.yaml                        resolved config of the run
    <save>/latest_checkpointed_iteration.txt  written last, by rename: never names a partial save
    <save>/iter_0000100/                      dist_checkpointing files (model + optimizer),
        train_state.json                      iteration, consumed samples, scheduler, layout, config
        rng/rank_00000.pt                     per-rank RNG states (restored when the layout is unchanged)

A save goes to `iter_N.tmp` first and is renamed when every rank has finished writing, so a
crash mid-save leaves the previous checkpoint as "latest".
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy
import torch
import torch.distributed as dist

LATEST = "latest_checkpointed_iteration.txt"


def iteration_dir(run_dir: Path, iteration: int) -> Path:
    """Directory of one checkpoint."""
    return Path(run_dir) / f"iter_{iteration:07d}"


def latest_iteration(run_dir: str | Path) -> int | None:
    """Iteration of the newest complete checkpoint in `run_dir`, or None."""
    marker = Path(run_dir) / LATEST
    if not marker.is_file():
        return None
    iteration = int(marker.read_text().strip())
    return iteration if iteration_dir(Path(run_dir), iteration).is_dir() else None


def resolve(path: str | Path) -> Path:
    """A checkpoint directory from a run directory (its latest) or an iter_* directory."""
    path = Path(path)
    if (path / "train_state.json").is_file():
        return path
    iteration = latest_iteration(path)
    if iteration is None:
        raise FileNotFoundError(f"{path} holds no complete checkpoint (no {LATEST} and no train_state.json); "
                                "pass a run directory written by `python -m pretrain train` or one of its iter_* dirs")
    return iteration_dir(path, iteration)


def read_train_state(checkpoint: str | Path) -> dict:
    """The JSON side of a checkpoint: iteration, consumed samples, scheduler, layout, config."""
    return json.loads((resolve(checkpoint) / "train_state.json").read_text())


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _rng_state() -> dict:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return {"python": random.getstate(), "numpy": numpy.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
            "tracker": get_cuda_rng_tracker().get_states()}


def _set_rng_state(state: dict) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    random.setstate(state["python"])
    numpy.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    get_cuda_rng_tracker().set_states(state["tracker"])


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


def save(run_dir: str | Path, iteration: int, engine, train_state: dict, keep_last: int) -> Path:
    """Collective: write checkpoint `iteration` atomically, then prune to the newest `keep_last`."""
    from megatron.core import dist_checkpointing

    run_dir = Path(run_dir)
    final, tmp = iteration_dir(run_dir, iteration), Path(f"{iteration_dir(run_dir, iteration)}.tmp")
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    model_state = engine.sharded_state_dict()
    state = {"model": model_state,
             "optimizer": engine.optimizer.sharded_state_dict(model_state, metadata=_optimizer_metadata(engine))}
    dist_checkpointing.save(state, str(tmp))
    (tmp / "rng").mkdir(exist_ok=True)
    torch.save(_rng_state(), tmp / "rng" / f"rank_{_rank():05d}.pt")
    _barrier()
    if _rank() == 0:
        record = dict(train_state, iteration=iteration, scheduler=engine.scheduler.state_dict(), layout=_layout(),
                      use_distributed_optimizer=engine.parallel.use_distributed_optimizer)
        (tmp / "train_state.json").write_text(json.dumps(record, indent=1, default=str))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        marker = run_dir / LATEST
        marker_tmp = run_dir / f"{LATEST}.tmp"
        marker_tmp.write_text(str(iteration))
        os.replace(marker_tmp, marker)  # the commit point
        _prune(run_dir, keep_last)
    _barrier()
    return final


def _prune(run_dir: Path, keep_last: int) -> None:
    for stale in run_dir.glob("iter_*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    complete = sorted(p for p in run_dir.glob("iter_*") if p.is_dir() and (p / "train_state.json").is_file())
    for old in complete[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def load(checkpoint: str | Path, engine, *, load_optimizer: bool = True) -> dict:
    """Collective: load model (+ optimizer, scheduler, RNG) into `engine` under its current TP/PP."""
    from megatron.core import dist_checkpointing

    path = resolve(checkpoint)
    record = json.loads((path / "train_state.json").read_text())
    model_state = engine.sharded_state_dict()
    request = {"model": model_state}
    if load_optimizer:
        saved_with = record.get("use_distributed_optimizer", False)
        if saved_with != engine.parallel.use_distributed_optimizer:
            raise ValueError(
                f"{path} was saved with parallel.use_distributed_optimizer={str(saved_with).lower()}; resume with the "
                "same setting, or start a new run from its weights with checkpoint.load=<that checkpoint>")
        request["optimizer"] = engine.optimizer.sharded_state_dict(model_state, is_loading=True,
                                                                   metadata=_optimizer_metadata(engine))
    loaded = dist_checkpointing.load(request, str(path))
    engine.load_state_dict(loaded["model"])
    if load_optimizer:
        engine.optimizer.load_state_dict(loaded["optimizer"])
        engine.scheduler.load_state_dict(record["scheduler"])
        rng_file = path / "rng" / f"rank_{_rank():05d}.pt"
        # RNG streams are per rank: only meaningful when the layout is the one that saved them.
        if record.get("layout") == _layout() and rng_file.is_file():
            _set_rng_state(torch.load(rng_file, weights_only=False))
    return record


def load_model_weights(checkpoint: str | Path, model) -> dict:
    """Load only the model weights of a checkpoint into a bare FloatPositionGPTModel (any TP/PP saved)."""
    from megatron.core import dist_checkpointing

    path = resolve(checkpoint)
    loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(path))
    model.load_state_dict(loaded["model"])
    return json.loads((path / "train_state.json").read_text())
