"""The context an export announces: config.json's `max_position_embeddings`, per position method.

Tools size their context from `max_position_embeddings` (lm-evaluation-harness's default max length,
serving stacks), so an export writes the length the model is meant to serve, not the training window w.
The rule, one row per case (first that applies; docs/hf.md quotes this table):

| case | max_position_embeddings | why |
|---|---|---|
| RoPE scaling `yarn` (strategy `ryarn` always ships it) or `dynamic_ntk` | w | transformers takes their original window from it: the frequencies depend on it |
| RoPE scaling `llama3` | max(w, factor · original window, original + 1) | the context the scaling was made for |
| strategy `rfs` | max(w, n_eval) | the linear factor shipped reproduces evaluation at n_eval (--eval-length) |
| strategy `posaug` | ⌈α_max · w⌉ | training positions reached α_max · (w − 1) |
| strategy `rpe`, `pose` | positions.max_position (L) | training positions were drawn from [0, L) |
| p-RoPE or NoPE-interleaved layers (strategy `none`) | 8 · w (pretrain.table.EXTRAPOLATION) | length methods, evaluated at 8w |
| strategy `none`, `random_base`, `warp` | w | positions never went past the window |
| RoPE scaling `pi` / `ntk` with factor f | f × the strategy's row | positions are divided (base stretched) by f |

`export-hf --max-position-embeddings N` overrides the rule, except with yarn / dynamic_ntk / llama3, where
the value is part of the scaling's numerics (refused in one line). Only this field changes: RoPE numerics,
and `original_max_position_embeddings` of the scalings that carry one, stay as pretrain.hf.rope writes them.
"""

from __future__ import annotations

import math

from megatron_ext.positions import RopeScaling

__all__ = ["FIXED_BY_SCALING", "served_length"]

# Scalings whose frequencies (or transformers' checks) read max_position_embeddings.
FIXED_BY_SCALING = ("yarn", "dynamic_ntk", "llama3")


def _strategy_length(train_config, eval_length: int | None) -> int:
    """The length the training positions (or the model options) cover, before any inference scaling."""
    from pretrain.hf.rope import rfs_eval_length
    from pretrain.table import EXTRAPOLATION

    positions, model, w = train_config.positions, train_config.model, int(train_config.model.seq_length)
    if positions.strategy == "rfs":
        return max(w, rfs_eval_length(train_config, eval_length))
    if positions.strategy == "posaug":
        return max(w, math.ceil(float(positions.alpha_max) * w))
    if positions.strategy in ("rpe", "pose"):
        return max(w, int(positions.max_position))
    if getattr(model, "rope_proportion", 1.0) < 1.0 or getattr(model, "no_rope_freq", None) is not None:
        return EXTRAPOLATION * w
    return w


def served_length(train_config, scaling: RopeScaling | None, rope_fields: dict, *,
                  eval_length: int | None = None, override: int | None = None) -> int:
    """config.json's max_position_embeddings for this export (the module docstring's table)."""
    kind = "none" if scaling is None else scaling.kind
    if getattr(train_config.model, "use_rope_scaling", False):
        kind = "llama3"
    if kind in FIXED_BY_SCALING:
        if override is not None:
            raise ValueError(f"--max-position-embeddings cannot be set with RoPE scaling {kind!r}: transformers "
                             "reads that field in the scaling's formula (it is written as the scaling needs)")
        return int(rope_fields["max_position_embeddings"])
    if override is not None:
        if override < 1:
            raise ValueError(f"--max-position-embeddings must be >= 1 (got {override})")
        return int(override)
    length = _strategy_length(train_config, eval_length)
    if kind in ("pi", "ntk") and train_config.positions.strategy != "rfs":
        length = math.ceil(float(scaling.resolve_factor(train_config.model.seq_length)) * length)
    return length
