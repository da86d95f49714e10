"""PoSE: positional skip-wise training (Zhu et al., "PoSE: Efficient Context Window Extension of LLMs via
Positional Skip-wise Training", ICLR 2024).

Rule: the training window of w tokens is cut into N chunks (N = 2 in the paper); chunk c keeps consecutive
position ids but starts u_c further on, with skipping biases 0 <= u_1 <= u_2 <= ... <= u_N <= L - w drawn
one after another, u_c ~ U{u_(c-1), ..., L - w} (u_0 = 0), L the target length (positions.max_position).
Every position id then lies in [0, L - 1], ids increase strictly, and over draws every id of the target
range occurs. Cut points are N - 1 distinct indices of 1..w-1 drawn uniformly (the authors' code draws the
first chunk's length from the window's first half; the paper leaves it open). Only positions change: the
tokens stay the window's consecutive tokens, and evaluation uses plain positions 0..n-1.
"""

from __future__ import annotations

import torch


def pose_positions(cut_keys: torch.Tensor, bias_uniforms: torch.Tensor, seq_len: int,
                   max_position: int) -> torch.Tensor:
    """PoSE position ids [..., seq_len] from uniforms: cut_keys [..., seq_len - 1], bias_uniforms [..., N]."""
    chunks = bias_uniforms.shape[-1]
    if chunks < 1 or chunks > seq_len:
        raise ValueError(f"positions.pose_chunks must be in 1..{seq_len} (the window) (got {chunks})")
    room = max_position - seq_len
    if room < 0:
        raise ValueError(f"positions.max_position ({max_position}) must be >= the window ({seq_len}) for pose")
    device = bias_uniforms.device
    # The N - 1 largest keys of 1..w-1 are a uniform (N - 1)-subset: the chunk starts after chunk 1.
    starts = cut_keys.topk(chunks - 1, dim=-1).indices + 1  # [..., N - 1]
    j = torch.arange(seq_len, device=device)
    chunk = (j.unsqueeze(-1) >= starts.unsqueeze(-2)).sum(-1)  # [..., s]: the chunk of each token
    biases, previous = [], torch.zeros_like(bias_uniforms[..., 0])
    for c in range(chunks):  # N is 2 or so: a loop over chunks, never over tokens
        previous = previous + torch.floor(bias_uniforms[..., c] * (room - previous + 1)).clamp(max=room - previous)
        biases.append(previous)
    bias = torch.stack(biases, dim=-1).gather(-1, chunk)  # [..., s]
    return j.to(torch.float32) + bias.to(torch.float32)
