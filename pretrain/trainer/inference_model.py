"""A trained model for inference: a checkpoint's weights in a one-process Megatron model."""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from pretrain.trainer import checkpoint


def load_for_inference(path: str | Path):
    """(model in eval mode, TrainConfig) from a checkpoint, on this process alone (TP=PP=1, CPU or GPU)."""
    from megatron_ext.model import ParallelConfig, build_model
    from pretrain.trainer import config as config_module
    from pretrain.trainer import distributed

    record = checkpoint.read_train_state(path)
    train_config = config_module.from_dict(record["config"])
    if not dist.is_initialized():
        distributed.initialize(ParallelConfig(), seed=train_config.seed)
    model = build_model(train_config.model, ParallelConfig())
    checkpoint.load_model_weights(path, model)
    return model.eval(), train_config
