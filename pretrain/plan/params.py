"""Parameters per GPU from Megatron's own parameter shapes, and the bytes each one costs in training.

The model is built once on the meta device (no memory, no initialisation) in a one-process gloo
world, through the same `megatron_ext.model.build_model` the trainer uses. Every parameter keeps
Megatron's `tensor_model_parallel` / `partition_dim` attributes, so a TP rank's shape is the TP=1
shape with `partition_dim` divided by TP; the vocabulary is padded for the planned TP exactly as
Megatron pads it. Pipeline stages split the layers evenly (Megatron's default): the first stage
holds the word embedding, the last the final norm and, with PP > 1 and tied embeddings, its own
copy of the embedding as the output layer (Megatron's shared-embedding rule).

Bytes per parameter follow the trainer's optimizer settings (pretrain/trainer/engine.py): Megatron DDP
with `grad_reduce_in_fp32=True` (4-byte gradient buffer for every parameter), and Adam with fp32 main
params for 16-bit weights (Float16OptimizerWithFloat16Params) — 2 + 4 + 4 + 4 + 4 = 18 bytes for a bf16
parameter; with the distributed optimizer the 12 optimizer bytes are sharded over DP: 6 + 12/DP
(megatron/training/theoretical_memory_usage.py). fp32 parameters (fp32 runs, and the local
implementation's RMSNorm weights) have no main copy: 4 + 4 + 8 (or 8/DP) bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from megatron_ext.model_config import ModelConfig

ADAM_STATE_BYTES = 8  # exp_avg + exp_avg_sq, fp32
GRAD_BYTES = 4  # DDP main_grad buffer, grad_reduce_in_fp32=True (engine.py)
MAIN_PARAM_BYTES = 4  # fp32 master copy of a 16-bit parameter
TORCH_ADAM_STEP_BYTES = 4  # torch.optim.AdamW keeps a float32 `step` tensor per parameter tensor


@dataclass(frozen=True)
class Tensor:
    """One parameter tensor as a TP=1 build sees it."""

    name: str
    numel: int
    partition_dim: int | None  # None: replicated over TP
    shape: tuple[int, ...]
    dtype_bytes: int


@dataclass
class StageParams:
    """What one GPU of a pipeline stage holds: tensors after TP splitting."""

    stage: int
    tensors: list[tuple[str, int, int]]  # (name, numel on this rank, bytes per element)

    @property
    def numel(self) -> int:
        """Parameters on this GPU."""
        return sum(n for _, n, _ in self.tensors)

    def weight_bytes(self) -> int:
        """Bytes of the model weights as stored."""
        return sum(n * b for _, n, b in self.tensors)


def _build_key(model: ModelConfig, tp: int) -> ModelConfig:
    # The vocabulary is padded to a multiple of 128·TP; a TP=1 build with that multiple has the
    # same padded size, and recompute/impl settings do not change shapes.
    return dataclasses.replace(model, make_vocab_size_divisible_by=model.make_vocab_size_divisible_by * tp,
                               transformer_impl="local", fp8=None, recompute_granularity=None,
                               recompute_method=None, recompute_num_layers=None)


def _ensure_world() -> None:
    """A one-process gloo world with Megatron's TP=PP=1 groups, for building shapes; reuses one that exists.

    Always gloo on a private TCP port, never env:// or NCCL: the plan runs in SLURM batch shells and on
    login nodes, where RANK/MASTER_* may be set for another purpose and a GPU may be absent or busy.
    """
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        return
    from megatron_ext import cpu_compat
    from pretrain.trainer.distributed import _free_port

    if not torch.cuda.is_available():
        cpu_compat.apply()
    if not dist.is_initialized():
        dist.init_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)


_BUILT: dict[tuple, tuple[Tensor, ...]] = {}


def megatron_tensors(model: ModelConfig, tp: int = 1) -> tuple[Tensor, ...]:
    """Every parameter of the whole model (one stage, TP=1) built by Megatron on the meta device.

    Builds are cached on disk (keyed by the config, TP and the megatron-core and torch versions), so
    a launcher's plan does not pay Megatron's import time again for a layout it has seen;
    PRETRAIN_PLAN_CACHE=0 turns the cache off, PRETRAIN_PLAN_CACHE=<dir> moves it.
    """
    key = (tuple(sorted(dataclasses.asdict(model).items())), tp)
    if key not in _BUILT:
        path = _cache_path(key)
        cached = _read_cache(path) if path else None
        _BUILT[key] = cached if cached is not None else _build(model, tp)
        if path and cached is None:
            _write_cache(path, _BUILT[key])
    return _BUILT[key]


def _cache_path(key: tuple) -> Path | None:
    setting = os.environ.get("PRETRAIN_PLAN_CACHE", "")
    if setting == "0":
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        versions = (version("megatron-core"), version("torch"))
    except PackageNotFoundError:
        return None
    root = Path(setting) if setting else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "posaug-plan"
    # 2: bf16 models hold bf16 norm weights with the local spec too (issue 42); older entries hold fp32 ones
    digest = hashlib.sha256(repr((key, versions, 2)).encode()).hexdigest()[:24]
    return root / f"{digest}.json"


def _read_cache(path: Path) -> tuple[Tensor, ...] | None:
    try:
        rows = json.loads(path.read_text())
        return tuple(Tensor(r[0], r[1], r[2], tuple(r[3]), r[4]) for r in rows)
    except (OSError, ValueError, TypeError, IndexError):
        return None  # absent or unreadable: build again


def _write_cache(path: Path, tensors: tuple[Tensor, ...]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps([[t.name, t.numel, t.partition_dim, list(t.shape), t.dtype_bytes] for t in tensors]))
        tmp.replace(path)  # atomic: a concurrent reader sees the old file or the whole new one
    except OSError:
        pass  # a read-only home only costs the next run a rebuild


def _build(model: ModelConfig, tp: int) -> tuple[Tensor, ...]:
    import torch

    from megatron_ext.model import ParallelConfig, build_model

    _ensure_world()
    config = _build_key(model, tp)
    with torch.device("meta"):
        built = build_model(config, ParallelConfig())
    te_dtype = 2 if model.bf16 else 4
    tensors = []
    for name, param in built.named_parameters():
        partition = getattr(param, "partition_dim", None) if getattr(param, "tensor_model_parallel", False) else None
        size = param.element_size()
        if model.transformer_impl == "transformer_engine":
            size = te_dtype  # TE creates its norm weights in params_dtype (as build_model casts the local ones)
        tensors.append(Tensor(name, param.numel(), partition, tuple(param.shape), size))
    return tuple(tensors)


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[2]) if len(parts) > 2 and parts[:2] == ["decoder", "layers"] else None


def stage_params(model: ModelConfig, tp: int, pp: int, stage: int) -> StageParams:
    """Parameters one GPU of pipeline stage `stage` holds under TP × PP."""
    tensors = megatron_tensors(model, tp)
    per_stage = model.num_layers // pp
    first, last = stage == 0, stage == pp - 1
    held = []
    embedding = None
    for t in tensors:
        layer = _layer_index(t.name)
        if layer is not None:
            keep = stage * per_stage <= layer < (stage + 1) * per_stage
        elif t.name.startswith("embedding."):
            embedding = t
            keep = first
        else:  # decoder.final_layernorm, output_layer (untied)
            keep = last
        if keep:
            held.append((t.name, _split(t, tp), t.dtype_bytes))
    if last and not first and not model.untie_embeddings_and_output_weights and embedding is not None:
        held.append(("output_layer.weight (shared embedding copy)", _split(embedding, tp), embedding.dtype_bytes))
    return StageParams(stage, held)


def _split(t: Tensor, tp: int) -> int:
    if t.partition_dim is None:
        return t.numel
    if t.shape[t.partition_dim] % tp:
        raise ValueError(f"{t.name}: dimension {t.partition_dim} ({t.shape[t.partition_dim]}) does not split over "
                         f"TP={tp}; change --tp")
    return t.numel // tp


def total_parameters(model: ModelConfig) -> tuple[int, int]:
    """(all parameters, embedding parameters) of the built model at TP=1."""
    tensors = megatron_tensors(model, 1)
    embedding = sum(t.numel for t in tensors if t.name.startswith("embedding.") or t.name.startswith("output_layer"))
    return sum(t.numel for t in tensors), embedding


@dataclass(frozen=True)
class StateBytes:
    """Bytes of weights, gradients and optimizer state on one GPU."""

    weights: int
    grads: int
    optimizer: float


def state_bytes(stage: StageParams, *, dp: int, distributed_optimizer: bool, torch_adam: bool) -> StateBytes:
    """Megatron's bytes per parameter applied tensor by tensor (main params only for 16-bit weights)."""
    weights = grads = 0
    optimizer = 0.0
    for _, numel, size in stage.tensors:
        weights += numel * size
        grads += numel * GRAD_BYTES
        per_param = ADAM_STATE_BYTES + (MAIN_PARAM_BYTES if size < 4 else 0)
        optimizer += numel * per_param / (dp if distributed_optimizer else 1)
        if torch_adam:
            optimizer += TORCH_ADAM_STEP_BYTES
    return StateBytes(weights, grads, optimizer)


def bytes_per_parameter(dtype_bytes: int, dp: int = 1, distributed_optimizer: bool = False) -> float:
    """Bytes one parameter costs: weight + fp32 grad + (fp32 main param) + Adam m, v; the last two over DP."""
    sharded = ADAM_STATE_BYTES + (MAIN_PARAM_BYTES if dtype_bytes < 4 else 0)
    return dtype_bytes + GRAD_BYTES + sharded / (dp if distributed_optimizer else 1)
