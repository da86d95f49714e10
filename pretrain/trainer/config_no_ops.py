"""Model settings whose value changes nothing in this run: refused where it can only be a mistake, noted where it is
legitimately harmless (issue 68). Checked at `train --check` and at training start (TrainConfig.validate and the
train command), not when a recorded config is read: a checkpoint trained with such a value stays readable.

- Every N-th layer global (model.window_attn_skip_freq) or without RoPE (model.no_rope_freq) with N above the layer
  count: no layer is global / NoPE, the very model that `null` gives. Nobody writes N for that model on purpose (a
  config whose num_layers was shrunk, a Gemma-style 6 on a 4-layer model), so it is refused, naming both fixes.
- A sliding window that holds a whole training sequence (model.window_size >= seq_length - 1: query i sees keys
  i - W .. i, so W = seq_length - 1 already reaches key 0 from the last query): the local layers train as full
  attention. That is a choice, not a slip: the window still acts at evaluation on contexts longer than W + 1 tokens
  (attention limited to what training saw), so it is noted, not refused.
"""

from __future__ import annotations

from megatron_ext.model_config import ModelConfig


def check_no_ops(model: ModelConfig) -> None:
    """ValueError naming the field and the fix when a layer-frequency field selects no layer at all."""
    layers = model.num_layers
    if model.window_size is not None and model.window_attn_skip_freq is not None \
            and model.window_attn_skip_freq > layers:
        n = model.window_attn_skip_freq
        raise ValueError(f"model.window_attn_skip_freq={n} makes layers {n}, {2 * n}, ... global, but the model has "
                         f"{layers} layers: none is global; set it to at most {layers} for global layers, or null for "
                         "sliding-window layers only")
    if model.no_rope_freq is not None and model.no_rope_freq > layers:
        n = model.no_rope_freq
        raise ValueError(f"model.no_rope_freq={n} takes RoPE from layers {n}, {2 * n}, ..., but the model has "
                         f"{layers} layers: none is NoPE; set it to at most {layers} for NoPE layers, or null for "
                         "RoPE in every layer")


def no_op_notes(model: ModelConfig) -> list[str]:
    """One line per setting that changes nothing in training but is kept (see the module's docstring)."""
    notes = []
    if model.window_size is not None and model.window_size >= model.seq_length - 1:
        notes.append(f"model.window_size={model.window_size} holds a whole training sequence (model.seq_length="
                     f"{model.seq_length}: every query sees all earlier keys), so the sliding-window layers train as "
                     f"full attention; the window acts only at evaluation on contexts longer than "
                     f"{model.window_size + 1} tokens (for windowed training set it below {model.seq_length - 1})")
    return notes
