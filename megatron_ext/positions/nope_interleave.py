"""NoPE-interleaved layers with attention temperature tuning (Llama 4's "iRoPE", Meta 2025; the RoPE/NoPE
hybrid studied as RNoPE by Yang et al., "Rope to Nope and Back Again", arXiv 2501.18795).

Rules:
- Layer l (1-based) has no RoPE when l is a multiple of the interval N (N = 4 in Llama 4): the pattern of
  Megatron-Core's `no_rope_freq=N` and of transformers' Llama 4 `no_rope_layer_interval=N` (Megatron's integer
  form needs N to divide the layer count; its list form, which we pass, and Llama 4's do not).
- On those NoPE layers only, the query of the token at position i is multiplied by
  1 + β·log1p(⌊(i + 1) / F⌋) (Llama 4: β = attn_scale = 0.1, F = floor_scale = 8192), so its logits grow
  with the context length instead of flattening. i is the token's index in the sequence (transformers'
  `cache_position`), not a PosAug-scaled position.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def nope_layers(num_layers: int, interval: int) -> list[bool]:
    """Per layer (index 0 = layer 1): True where the layer has no RoPE (every `interval`-th layer)."""
    if interval < 1:
        raise ValueError(f"model.no_rope_freq must be >= 1 (got {interval}): every N-th layer has no RoPE")
    return [(layer + 1) % interval == 0 for layer in range(num_layers)]


def attention_temperature(token_index: torch.Tensor, beta: float, floor: float) -> torch.Tensor:
    """Llama 4's NoPE-layer query scale 1 + β·log1p(⌊(i + 1) / F⌋) at token indices i (float32)."""
    import torch

    index = token_index.to(torch.float32)
    return 1.0 + beta * torch.log1p(torch.floor((index + 1.0) / floor))
