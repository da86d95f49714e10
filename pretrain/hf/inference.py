"""Calling an exported (or any HF Llama-family) model at scaled, fractional positions.

HF Llama computes `inv_freq @ position_ids.float()`, so float positions (PosAug's α·i, RFS's
evaluation positions, PI) can go in as `position_ids`. But when `attention_mask` is None,
transformers (5.x, `masking_utils.find_packed_sequence_indices`) reads any gap between
consecutive positions other than 1 as the start of a new packed sequence and masks attention
across it; the logits are then wrong without any error. Passing an explicit attention mask
(all ones, or the caller's padding mask) turns that inference off.
"""

from __future__ import annotations

from typing import Any

import torch


def scaled_positions_forward(model, input_ids: torch.Tensor, positions: torch.Tensor,
                             attention_mask: torch.Tensor | None = None, **kwargs: Any):
    """`model(...)` at float positions [s] or [b, s], with the attention mask that keeps them one sequence."""
    positions = positions.to(device=input_ids.device, dtype=torch.float32)
    if positions.dim() == 1:
        positions = positions[None].expand(input_ids.shape[0], -1)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    kwargs.setdefault("use_cache", False)
    return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, **kwargs)


def hf_logits(hf_model, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Logits of an HF causal LM at (possibly fractional) positions [s] or [b, s]; default 0..s-1."""
    if positions is None:
        positions = torch.arange(tokens.shape[1], dtype=torch.float32)
    with torch.no_grad():
        return scaled_positions_forward(hf_model, tokens, positions).logits
