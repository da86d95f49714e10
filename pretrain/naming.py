"""Run naming: which size and which method of the table (pretrain/table.py) a run's config is.

Below the trainer, which names its run on the console, and `runs` / `eval all`, which list
and group runs by these names.
"""

from __future__ import annotations

import dataclasses

from pretrain.table import METHODS, SIZES

# Model fields that make a method (table.METHODS rows' model=): a run matches a row only when they agree.
METHOD_MODEL_KEYS = ("position_embedding_type", "rope_proportion", "no_rope_freq", "attn_temperature_tuning",
                     "attn_temperature_floor", "ssmax_scale")
ARCHITECTURE_KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups")


def _fields(section) -> dict:
    if dataclasses.is_dataclass(section):
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(section).items()}
    return dict(section)


def size_name(model) -> str:
    """The table.SIZES name of a model (ModelConfig or its dict), else its non-embedding size, e.g. '3.2M'."""
    fields = _fields(model)
    if fields.get("num_query_groups") is None:
        fields["num_query_groups"] = fields.get("num_attention_heads")
    for name, size in SIZES.items():
        arch = dict(size.architecture)
        arch.setdefault("num_query_groups", arch.get("num_attention_heads"))
        if all(arch.get(k) == fields.get(k) for k in ARCHITECTURE_KEYS):
            return name
    from megatron_ext.model import ModelConfig

    known = {f.name for f in dataclasses.fields(ModelConfig)}
    params = ModelConfig(**{k: v for k, v in fields.items() if k in known}).non_embedding_parameters()
    return f"{params / 1e6:.3g}M"


def method_name(positions, window: int, model=None) -> str:
    """The table.METHODS row whose resolved positions (and, given `model`, model options) equal the run's."""
    from megatron_ext.model import ModelConfig
    from megatron_ext.positions import PositionConfig

    fields = _fields(positions)
    model_fields = None if model is None else _fields(model)
    for name, method in METHODS.items():
        if _fields(PositionConfig(**method.position_fields(window))) != fields:
            continue
        if model_fields is not None:
            wanted = {**{k: getattr(ModelConfig, k) for k in METHOD_MODEL_KEYS}, **method.model_fields(window)}
            if any(model_fields.get(k, getattr(ModelConfig, k)) != v for k, v in wanted.items()):
                continue
        return name
    return str(fields.get("strategy", "?"))
