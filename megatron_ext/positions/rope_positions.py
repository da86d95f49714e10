"""`RopePositions`: the hand-off from a position strategy to the RoPE hook."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RopePositions:
    """What the Megatron RoPE hook needs for one microbatch."""

    # float32 [s] (shared by the batch) or [b, s] (one row per sample).
    positions: torch.Tensor
    # float32 [num_layers, s] or [num_layers, b, s]; the layer with 1-based layer_number n
    # uses row n - 1 instead of `positions`. None means every layer uses `positions`.
    layer_positions: torch.Tensor | None = None
    # float32 [rotary_dim // 2] or [b, rotary_dim // 2] (per sample); replaces the model's
    # inverse frequencies when set (random_base, NTK, YaRN, ...). None means the model's own.
    inv_freq: torch.Tensor | None = None
    # YaRN mscale: multiplies cos and sin.
    attention_factor: float = 1.0

    @property
    def per_sample(self) -> bool:
        """True when the angles differ per sample (positions, layer rows or inv_freq carry a batch dim)."""
        return (self.positions.dim() == 2
                or (self.layer_positions is not None and self.layer_positions.dim() == 3)
                or (self.inv_freq is not None and self.inv_freq.dim() == 2))

    def for_layer(self, layer_number: int) -> torch.Tensor:
        """Positions used by the layer with 1-based `layer_number`."""
        if self.layer_positions is None:
            return self.positions
        if not 1 <= layer_number <= self.layer_positions.shape[0]:
            raise IndexError(
                f"layer_number {layer_number} outside 1..{self.layer_positions.shape[0]}"
            )
        return self.layer_positions[layer_number - 1]
