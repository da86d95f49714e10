"""A trained model for inference: a checkpoint's weights in a one-process Megatron model."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch.distributed as dist

from pretrain.trainer import checkpoint


def runnable_here(model_config, path: str | Path):
    """The recorded model config with kernel choices this machine cannot run replaced by what it can, saying so.

    A kernel choice is not part of a checkpoint's identity: the weights are the same whichever kernel trained them
    (resume_check.MAY_CHANGE), so a run trained with the fused Triton RoPE kernel on a GPU is read on a CPU node
    with the unfused one."""
    from megatron_ext.rope_attention import chosen_rope_kernel

    if model_config.rope_kernel != "triton":
        return model_config
    try:
        chosen_rope_kernel("triton", rope=model_config.position_embedding_type == "rope")
        return model_config
    except ValueError:
        print(f"note: {path} was trained with model.rope_kernel=triton, which cannot run here; reading it with "
              "rope_kernel=auto (the same weights; the unfused kernel on this machine)", file=sys.stderr)
        return dataclasses.replace(model_config, rope_kernel="auto")


def load_for_inference(path: str | Path):
    """(model in eval mode, TrainConfig) from a checkpoint, on this process alone (TP=PP=1, CPU or GPU)."""
    from megatron_ext.model import ParallelConfig, build_model
    from pretrain.trainer import config as config_module
    from pretrain.trainer import distributed

    record = checkpoint.read_train_state(path)
    train_config = config_module.from_dict(record["config"])
    train_config = dataclasses.replace(train_config, model=runnable_here(train_config.model, path))
    if not dist.is_initialized():
        distributed.initialize(ParallelConfig(), seed=train_config.seed)
    model = build_model(train_config.model, ParallelConfig())
    checkpoint.load_model_weights(path, model)
    return model.eval(), train_config
