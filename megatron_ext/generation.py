"""Greedy decoding with a FloatPositionGPTModel at the run's evaluation positions.

Megatron's own inference engine caches keys and values and builds RoPE angles from integer
positions, which cannot express PosAug/RFS/PI/YaRN evaluation positions (and the positions
of some strategies, e.g. RFS, depend on the whole length). So every step re-runs the full
sequence with the positions for its current length: exact, and cheap enough for the short
continuations used in evaluation (cost grows with length²; no KV cache).
"""

from __future__ import annotations

from typing import Callable

import torch

from megatron_ext.positions import RopePositions


@torch.no_grad()
def greedy_generate(model: torch.nn.Module, prompt_tokens: torch.Tensor, max_new_tokens: int,
                    positions_for_length: Callable[[int], torch.Tensor | RopePositions],
                    vocab_size: int | None = None) -> torch.Tensor:
    """Prompt [b, s] followed by `max_new_tokens` argmax tokens; positions_for_length(n) gives the positions of n tokens.

    Pass e.g. `lambda n: sampler.evaluation(n)` for a run's evaluation positions (with its
    positions.rope_scaling), and `vocab_size` to keep padded vocabulary rows out of the argmax.
    """
    if prompt_tokens.dim() != 2 or prompt_tokens.shape[1] < 1:
        raise ValueError(f"prompt_tokens must be [batch, length >= 1] (got shape {tuple(prompt_tokens.shape)})")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0 (got {max_new_tokens})")
    was_training = model.training
    model.eval()
    tokens = prompt_tokens
    try:
        for _ in range(max_new_tokens):
            logits = model(tokens, positions_for_length(tokens.shape[1]), None)[:, -1]
            if vocab_size is not None:
                logits = logits[:, :vocab_size]
            tokens = torch.cat([tokens, logits.argmax(-1, keepdim=True).to(tokens.dtype)], dim=1)
    finally:
        model.train(was_training)
    return tokens
