"""A trained model for inference: a checkpoint's weights in a one-process Megatron model."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch.distributed as dist

from megatron_ext.model_config import ModelConfig
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


# The model fields a reader may choose for itself with `--set`: how the same weights are computed on this machine,
# never what they mean. resume_check.MAY_CHANGE lists every field a resume may change; these are the ones a forward
# pass reads (recompute, dropout, the init std, bf16 training and the trainer's compile shape training only).
INFERENCE_FIELDS = ("model.core_attention", "model.rope_kernel")
RUNTIME_ROPE = ("positions.rope_scaling", "positions.rope_scaling_factor")  # eval run's --rope-scaling / --factor


def check_inference_overrides(items: list[str]) -> None:
    """ValueError (one line, the fix) unless every `--set KEY=VALUE` of a reader names an inference-time field."""
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected key=value, e.g. --set model.rope_kernel=unfused")
        key = item.split("=", 1)[0].strip()
        if key in INFERENCE_FIELDS:
            continue
        if key in RUNTIME_ROPE:
            raise ValueError(f"--set {key}: an inference-time RoPE transform is given by eval run's --rope-scaling "
                             "and --factor (its record is named after it); pass those instead")
        what = ("changes what the checkpoint's weights mean (their shapes, or the function they were trained for)"
                if key.startswith("model.") else "is how the run was trained, which a reader takes from the checkpoint")
        raise ValueError(f"--set {key} {what}: a reader sets only the inference-time fields "
                         f"{', '.join(INFERENCE_FIELDS)}")


def with_overrides(model_config: ModelConfig, recorded: dict, overrides: list[str],
                   path: str | Path) -> ModelConfig:
    """The model config to read `path` with: the recorded one, kernels this machine cannot run replaced (saying
    so), then the reader's `--set` inference-time fields, checked as a training start checks them."""
    from pretrain.trainer import config as config_module

    check_inference_overrides(overrides)
    keys = {item.split("=", 1)[0].strip() for item in overrides}
    if "model.rope_kernel" not in keys:  # the reader's own choice is kept, and refused below if it cannot run
        model_config = runnable_here(model_config, path)
    if not overrides:
        return model_config
    chosen = config_module.from_dict(config_module.apply_overrides(recorded, overrides)).model
    changed = {key.split(".", 1)[1]: getattr(chosen, key.split(".", 1)[1]) for key in keys}
    if changed.get("rope_kernel") == "triton":  # a GPU (or Triton's interpreter) is needed, as at a training start
        from megatron_ext.rope_attention import chosen_rope_kernel

        chosen_rope_kernel("triton", rope=model_config.position_embedding_type == "rope")
    print(f"note: reading {path} with " + ", ".join(f"model.{name}={value} (recorded: {getattr(model_config, name)})"
                                                     for name, value in sorted(changed.items())), file=sys.stderr)
    return dataclasses.replace(model_config, **changed)


def load_for_inference(path: str | Path, overrides: list[str] | tuple[str, ...] = ()):
    """(model in eval mode, TrainConfig) from a checkpoint, on this process alone (TP=PP=1, CPU or GPU), with the
    reader's `--set` inference-time model fields (INFERENCE_FIELDS) applied."""
    from megatron_ext.model import ParallelConfig, build_model
    from pretrain.trainer import config as config_module
    from pretrain.trainer import distributed

    record = checkpoint.read_train_state(path)
    train_config = config_module.from_dict(record["config"])
    train_config = dataclasses.replace(train_config, model=with_overrides(train_config.model, record["config"],
                                                                          list(overrides), path))
    if not dist.is_initialized():
        distributed.initialize(ParallelConfig(), seed=train_config.seed)
    model = build_model(train_config.model, ParallelConfig())
    checkpoint.load_model_weights(path, model)
    return model.eval(), train_config
