"""RoPE and its inference-time scaling ↔ Hugging Face config.json fields.

One vocabulary (megatron_ext.positions.scaling): kinds none | pi | ntk | dynamic_ntk | yarn,
written as HF rope types through HF_ROPE_TYPE (static NTK is a change of base, so it exports as
`rope_theta` with the default type).

config.json carries both layouts, so either transformers major version reads the same RoPE:

- transformers 4.x reads top-level `rope_theta` and `rope_scaling` ({"rope_type", "factor"};
  null for plain RoPE). Its dynamic formula, and its yarn formula up to 4.50, take the original
  window from `max_position_embeddings`, so that is the training window, and yarn's
  `original_max_position_embeddings` is left out (4.45-4.50 warn about it, 4.51-4.53 would
  re-derive the factor from it). Checked by running the exports under 4.45.2 and 4.57.1: logits
  equal 5.23's bit for bit; 4.57.1 only notes (a warning) that it takes max_position_embeddings
  as yarn's original window, which is what it is.
- transformers 5.x reads `rope_parameters` ({"rope_type", "rope_theta", "factor", ...}); when a
  config also has a non-null `rope_scaling`, 5.x takes that dict instead and fills its
  `rope_theta` from the top-level one (`RotaryEmbeddingConfigMixin.convert_rope_params_to_dict`,
  5.23), which gives the same parameters.

Only keys that 4.45 and 5.23 validate without a warning are written, and no factor < 1.

`llama3` (Llama 3.1/3.2) carries its own original window, low_freq_factor and high_freq_factor;
transformers warns unless max_position_embeddings exceeds that window, so a llama3 export
writes max(training window, factor × original window) there (the context the scaling was made
for; llama3 frequencies do not depend on it). A model trained with llama3 scaling
(model.use_rope_scaling, e.g. an imported Llama 3.1) exports it as its only rope type.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from megatron_ext.positions import RopeScaling, randomized_yarn
from megatron_ext.positions.scaling import HF_ROPE_TYPE, ROPE_SCALING_ALIASES, ROPE_SCALING_KINDS, scaling_kind

__all__ = ["ROPE_SCALING_KINDS", "hf_rope_fields", "hf_rope_parameters", "rfs_eval_length",
           "rope_scaling_for", "rope_from_hf_config"]


def rfs_eval_length(train_config, eval_length: int | None) -> int:
    """The RFS evaluation length an export reproduces: --eval-length, else window × EXTRAPOLATION."""
    from pretrain.table import EXTRAPOLATION

    return int(eval_length) if eval_length is not None else train_config.model.seq_length * EXTRAPOLATION


def rope_scaling_for(train_config, *, kind: str | None = None, factor: float | None = None,
                     eval_length: int | None = None) -> RopeScaling | None:
    """The scaling an export ships so HF reproduces the run's evaluation positions (None = plain RoPE).

    posaug / rpe / warp / random_base / none evaluate with plain RoPE (alpha = 1, the base
    B0), so they export without scaling unless `kind` asks for one (e.g. PosAug + YaRN).
    ryarn (Randomized YaRN) evaluates with YaRN at its training scale s (or positions' s' >= s), so it
    exports that, or YaRN at a larger --factor (megatron_ext.positions.randomized_yarn).
    RFS evaluates n_eval tokens at L(2i - 1) / (2M), M = max(n_train, n_eval): the constant
    L / (2M) cancels in RoPE's relative rotation, leaving positions (i - 1) L / M, i.e. HF
    linear scaling with factor M / L (HF divides positions by the factor).
    """
    kind = scaling_kind(kind)
    positions, n_train = train_config.positions, train_config.model.seq_length
    if getattr(train_config.model, "use_rope_scaling", False) and (kind != "none" or factor is not None):
        raise ValueError("the model carries Llama 3 RoPE scaling (model.use_rope_scaling), which its export ships; "
                         "an HF config holds one rope type, so drop --rope-scaling/--factor")
    if positions.strategy == "rfs":
        if kind != "none" or factor is not None:
            raise ValueError("an RFS model exports the linear scaling that reproduces its evaluation positions; "
                             "drop --rope-scaling/--factor (set the length with --eval-length)")
        n_eval = rfs_eval_length(train_config, eval_length)
        m = max(n_train, n_eval)
        if m < positions.max_position:
            raise ValueError(f"--eval-length {n_eval} is below the RFS range positions.max_position = "
                             f"{positions.max_position}: HF cannot express the factor {m}/{positions.max_position} "
                             f"< 1; pass --eval-length {positions.max_position} or more")
        return RopeScaling(kind="pi", factor=m / positions.max_position, original_max_position_embeddings=n_train)
    if positions.strategy == "ryarn":
        if eval_length is not None:
            raise ValueError("--eval-length sets the linear factor of RFS models only (this run is 'ryarn'); "
                             "a larger YaRN factor is --rope-scaling yarn --factor F")
        s = positions.ryarn_scale(n_train)
        if kind == "none":
            if factor is not None:
                raise ValueError("--factor needs --rope-scaling yarn (a ryarn model exports YaRN only)")
            # The run's own evaluation rule: its s, or positions.rope_scaling=yarn's s' >= s.
            s = randomized_yarn.inference_factor(s, positions.rope_scaling, positions.rope_scaling_factor)
        else:
            s = randomized_yarn.inference_factor(s, kind, factor, kind_name="--rope-scaling", factor_name="--factor")
        return RopeScaling(kind="yarn", factor=s, original_max_position_embeddings=n_train)
    if eval_length is not None:
        raise ValueError(f"--eval-length sets the linear factor of RFS models only (this run is "
                         f"{positions.strategy!r}); use --rope-scaling KIND --factor F")
    if kind == "none":
        if factor is not None:
            raise ValueError("--factor needs --rope-scaling pi|ntk|dynamic_ntk|yarn|llama3")
        return None
    if factor is None or not factor >= 1:
        raise ValueError(f"--rope-scaling {kind} needs --factor >= 1 (got {factor})")
    return RopeScaling(kind=kind, factor=float(factor), original_max_position_embeddings=n_train)


def hf_rope_fields(model_config, scaling: RopeScaling | None) -> dict[str, Any]:
    """config.json fields (both transformers layouts) for RoPE(model_config) under `scaling` (or its own llama3)."""
    theta, n_train = float(model_config.rotary_base), int(model_config.seq_length)
    proportion = float(getattr(model_config, "rope_proportion", 1.0))
    if proportion < 1.0:  # p-RoPE is transformers' "proportional" (same frequencies, same ⌊p·d/2⌋ kept)
        if scaling is not None:
            raise ValueError(f"a p-RoPE model (model.rope_proportion={proportion:g}) cannot also ship RoPE scaling "
                             f"{scaling.kind!r}: an HF config holds one rope type")
        parameters = {"rope_type": "proportional", "rope_theta": theta, "partial_rotary_factor": proportion}
        return {"max_position_embeddings": n_train, "rope_theta": theta, "rope_scaling": dict(parameters),
                "rope_parameters": parameters}
    if getattr(model_config, "use_rope_scaling", False):
        if scaling is not None:
            raise ValueError("the model carries Llama 3 RoPE scaling (model.use_rope_scaling); an HF config "
                             f"holds one rope type, so it cannot also ship {scaling.kind!r}")
        scaling = model_config.rope_scaling()
    kind = "none" if scaling is None else scaling.kind
    rope_type = HF_ROPE_TYPE[kind]
    factor = None if scaling is None else float(scaling.resolve_factor(n_train))
    if kind == "ntk":
        d = model_config.rotary_dim
        theta = theta * factor ** (d / (d - 2))  # megatron_ext.positions.scaled_inv_freq's NTK base
    legacy = None if rope_type == "default" else {"rope_type": rope_type, "factor": factor}
    parameters = {"rope_type": rope_type, "rope_theta": theta}
    if legacy:
        parameters["factor"] = factor
    if rope_type == "yarn":
        parameters["original_max_position_embeddings"] = n_train
    max_positions = n_train
    if rope_type == "llama3":
        original = int(scaling.original_max_position_embeddings or n_train)
        extra = {"original_max_position_embeddings": original, "low_freq_factor": float(scaling.low_freq_factor),
                 "high_freq_factor": float(scaling.high_freq_factor)}
        legacy.update(extra)
        parameters.update(extra)
        max_positions = max(n_train, math.ceil(factor * original), original + 1)
    return {"max_position_embeddings": max_positions, "rope_theta": theta, "rope_scaling": legacy,
            "rope_parameters": parameters}


def exported_scaling_record(scaling: RopeScaling | None) -> dict | None:
    """What config.json's training metadata records about the shipped scaling (our vocabulary)."""
    return None if scaling is None else {"kind": scaling.kind, "factor": scaling.factor,
                                         "hf_rope_type": HF_ROPE_TYPE[scaling.kind]}


def hf_rope_parameters(get: Callable[..., Any]) -> tuple[float, str, dict[str, Any]]:
    """(rope_theta, HF rope_type, its parameters) of a config.json in either transformers layout.

    Like transformers 5.x, a non-null legacy `rope_scaling` wins over `rope_parameters`.
    """
    parameters = dict(get("rope_parameters") or {})
    legacy = dict(get("rope_scaling") or {})
    chosen = legacy or parameters
    theta = chosen.get("rope_theta", parameters.get("rope_theta", get("rope_theta", 10000.0)))
    rope_type = chosen.get("rope_type", chosen.get("type", "default"))
    return float(theta), str(rope_type), chosen


def rope_from_hf_config(get: Callable[..., Any]) -> tuple[float, str]:
    """(rope_theta, our scaling kind) of a Llama config.json in either transformers layout."""
    theta, rope_type, _ = hf_rope_parameters(get)
    hf_to_ours = {hf: ours for ours, hf in HF_ROPE_TYPE.items() if ours != "ntk"}
    kind = hf_to_ours.get(rope_type, ROPE_SCALING_ALIASES.get(rope_type, rope_type))
    return theta, kind
