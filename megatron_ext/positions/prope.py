"""p-RoPE: RoPE with its lowest frequencies removed (Barbero et al., "Round and Round We Go! What makes
Rotary Positional Encodings useful?", ICLR 2025).

Rule: of the d/2 RoPE frequencies θ_k = base^(-2k/d), k = 0..d/2-1 (fastest first), keep the fastest
⌊p·d/2⌋ unchanged and set the rest to 0, so those channel pairs rotate by angle 0 at every position and
carry semantic, position-free information. p = 1 is RoPE; p = 0 is NoPE. This is transformers'
`rope_type: "proportional"` with `partial_rotary_factor = p` (the frequencies keep the full-d spacing,
unlike partial rotary, which re-spaces them over p·d channels).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

from .scaling import rope_inv_freq


def kept_frequencies(rotary_dim: int, proportion: float) -> int:
    """How many of the rotary_dim/2 frequencies p-RoPE keeps: ⌊p·rotary_dim/2⌋ (transformers' rounding)."""
    if not 0.0 <= proportion <= 1.0:
        raise ValueError(f"model.rope_proportion must be in [0, 1] (got {proportion})")
    return int(proportion * rotary_dim // 2)


def prope_inv_freq(rotary_dim: int, base: float, proportion: float,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """RoPE inverse frequencies [rotary_dim/2] with all but the fastest ⌊p·rotary_dim/2⌋ set to 0."""
    import torch

    inv_freq = rope_inv_freq(rotary_dim, base, device)
    kept = kept_frequencies(rotary_dim, proportion)
    return torch.where(torch.arange(inv_freq.numel(), device=inv_freq.device) < kept, inv_freq,
                       torch.zeros_like(inv_freq))
