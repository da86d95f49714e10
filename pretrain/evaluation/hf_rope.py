"""Evaluation frequencies and YaRN factor written into a transformers model's rotary modules for one call.

Reaches into transformers internals (checked against transformers 5.23.0):
- rotary module `inv_freq` / `original_inv_freq` (buffers), `attention_scaling`, `max_seq_len_cached`,
  `rope_type`: evaluation frequencies are swapped in for one call. transformers' `dynamic_rope_update`
  rewrites inv_freq and raises max_seq_len_cached during a dynamic-NTK forward, so all five are saved and restored
  around every call (else a later call runs with the restored unscaled inv_freq and results depend on the batch
  size), and rope_type is "default" while replacement frequencies are in place.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from megatron_ext.positions import RopePositions


def rotary_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's rotary modules (those holding an inv_freq tensor)."""
    return [m for m in model.modules() if isinstance(getattr(m, "inv_freq", None), torch.Tensor)]


# Per-call state of a transformers rotary module; transformers' dynamic-NTK update rewrites it
# during a forward (see this module's docstring).
_ROTARY_STATE = ("inv_freq", "original_inv_freq", "attention_scaling", "max_seq_len_cached", "rope_type")


@contextlib.contextmanager
def hf_rope(model: torch.nn.Module, rope: RopePositions) -> Iterator[None]:
    """Give every rotary module rope.inv_freq / rope.attention_factor for one call; restore its state after.

    Restoring all of _ROTARY_STATE makes every call start from the loaded model: a dynamic-NTK
    model then computes its frequencies for each call's own length, whatever ran before.
    """
    if rope.layer_positions is not None:
        raise ValueError("per-layer positions cannot be evaluated through an HF model")
    modules = rotary_modules(model)
    if not modules:
        raise ValueError(f"{type(model).__name__} has no rotary module with an inv_freq buffer: not a RoPE model")
    saved = [(m, {name: getattr(m, name) for name in _ROTARY_STATE if hasattr(m, name)}) for m in modules]
    try:
        for m, state in saved:
            if rope.inv_freq is not None:
                inv_freq = state["inv_freq"]
                if rope.inv_freq.numel() != inv_freq.numel():
                    raise ValueError(f"replacement inv_freq has {rope.inv_freq.numel()} entries; the model's "
                                     f"rotary module has {inv_freq.numel()}")
                m.inv_freq = rope.inv_freq.to(device=inv_freq.device, dtype=inv_freq.dtype)
                if "rope_type" in state:
                    m.rope_type = "default"  # no dynamic update may overwrite the replacement
            if rope.attention_factor != 1.0:
                m.attention_scaling = state.get("attention_scaling", 1.0) * rope.attention_factor
        yield
    finally:
        for m, state in saved:
            for name, value in state.items():
                setattr(m, name, value)
