"""Resuming a checkpoint in the other parameter dtype (model.bf16 true <-> false).

Reaches into Megatron-Core's checkpoint layout (its sharded optimizer-state keys and ChainedOptimizer.chained_optimizers,
checked against megatron-core 0.16.1): not a promised API, so a changed layout fails the bitwise resume tests in
tests/trainer/test_resume_precision.py.

Both precisions checkpoint the same tensors under the same keys except for two things, which this module bridges:
- Megatron's mixed-precision optimizer (bf16, no distributed optimizer) saves {'optimizer': Adam state,
  'fp32_from_fp16_params': fp32 main params}; the fp32 optimizer saves the Adam state alone. The Adam tensors
  (`optimizer.state.exp_avg.<key>` ...) have the same keys in both, so the load request is only reshaped to the
  structure the checkpoint was saved with (its param groups and step live in common.pt under that structure).
- The fp32 values of the weights live under `optimizer.state.fp32_param.<key>` in a bf16 checkpoint (the main
  params; `optimizer.state.param.<key>` in every distributed-optimizer checkpoint) and under `<key>` in a plain
  fp32 one. A bf16 -> fp32 resume takes its weights from the fp32 main params, not from the bf16-rounded copies;
  an fp32 -> bf16 resume of the plain mixed-precision optimizer takes its main params from the fp32 weights.
So the resumed run continues from exactly the fp32 values the saved run was optimising.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from pretrain.trainer.run_dir import CheckpointError

# Megatron's key prefix of the fp32 main params: the mixed-precision optimizer's, and the distributed optimizer's in
# its fully-reshardable format (which saves them for fp32 params too)
MAIN_PARAM_PREFIX = {False: "optimizer.state.fp32_param", True: "optimizer.state.param"}


def saved_bf16(record: dict) -> bool:
    """Whether the checkpoint whose train_state.json is `record` was saved by a bf16 run."""
    return bool(record.get("config", {}).get("model", {}).get("bf16", False))


def _changes(engine, record: dict) -> bool:
    changed = saved_bf16(record) != engine.model_config.bf16
    chained = getattr(engine.optimizer, "chained_optimizers", [engine.optimizer])
    if changed and len(chained) != 1:
        raise CheckpointError(f"model.bf16 changed on resume, but this model has {len(chained)} Megatron optimizers "
                              "(expert or separately configured params), whose state cannot be mapped across "
                              "precisions; resume with the checkpoint's model.bf16")
    return changed


def _plain(engine) -> bool:
    return not engine.parallel.use_distributed_optimizer


def optimizer_request(engine, request: dict, record: dict) -> dict:
    """The optimizer part of a load request, shaped as the checkpoint's optimizer saved it."""
    if not _changes(engine, record) or not _plain(engine):
        return request  # the distributed optimizer saves the same structure for both dtypes
    if saved_bf16(record):
        return {"optimizer": request}  # its 'fp32_from_fp16_params' are read by load_weights instead
    return request["optimizer"]


def loaded_optimizer_state(engine, loaded: dict, record: dict) -> dict:
    """The loaded optimizer state in the structure this run's optimizer loads (inverse of optimizer_request)."""
    if not _changes(engine, record) or not _plain(engine):
        return loaded
    if saved_bf16(record):
        return loaded["optimizer"]
    # the main params are overwritten right after by load_weights; their current values stand in
    optimizer = getattr(engine.optimizer, "chained_optimizers", [engine.optimizer])[0]
    return {"optimizer": loaded, "fp32_from_fp16_params": optimizer.fp32_from_float16_groups}


@torch.no_grad()
def load_weights(engine, record: dict, read: Callable[[dict], dict]) -> None:
    """After a load across precisions, set the fp32 values the checkpoint holds: as the weights of an fp32 run, as
    the main params of a plain bf16 run (a distributed optimizer already loaded its own)."""
    if not _changes(engine, record):
        return
    from megatron.core.dist_checkpointing.optimizer import get_param_id_to_sharded_param_map

    model_state = engine.sharded_state_dict()
    if saved_bf16(record):
        targets = [p for chunk in engine.chunks for p in chunk.module.parameters()]
        prefix = MAIN_PARAM_PREFIX[engine.parallel.use_distributed_optimizer]
        key = lambda sharded: f"{prefix}.{sharded.key}"  # noqa: E731
    elif _plain(engine):
        optimizer = getattr(engine.optimizer, "chained_optimizers", [engine.optimizer])[0]
        params = [p for group in optimizer.float16_groups for p in group]
        masters = [m for group in optimizer.fp32_from_float16_groups for m in group]
        by_param = dict(zip(map(id, params), masters))
        targets = params
        key = lambda sharded: sharded.key  # noqa: E731
    else:
        return
    sharded = get_param_id_to_sharded_param_map(model_state, targets)
    request, destinations = {}, {}
    for index, model_sharded in sharded.items():
        param = targets[index]
        destination = param if saved_bf16(record) else by_param[id(param)]
        name = f"t{index}"
        request[name] = replace(model_sharded, key=key(model_sharded), data=torch.empty_like(destination),
                                **({"dtype": destination.dtype} if hasattr(model_sharded, "dtype") else {}))
        destinations[name] = destination
    loaded = read(request)
    for name, destination in destinations.items():
        destination.copy_(loaded[name])
