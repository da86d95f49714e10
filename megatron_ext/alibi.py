"""ALiBi (Press et al., 2022) from arbitrary position tensors: pure torch, no Megatron.

The bias is -m_h * |p_i - p_j| for query i, key j and head h, where p are whatever positions
the sampler made: integers (plain ALiBi) or floats (RFS / RPE / PosAug positions on ALiBi,
the RFS paper's appendix C.3). With p = arange it is the paper's bias.
"""

from __future__ import annotations

import math

import torch


def _power_of_two_slopes(n: int) -> list[float]:
    start = 2.0 ** (-8.0 / n)
    return [start ** (i + 1) for i in range(n)]


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The standard head slopes: 2^(-8h/n) for n a power of two, Press et al.'s interleave otherwise."""
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1 (got {num_heads})")
    if math.log2(num_heads).is_integer():
        slopes = _power_of_two_slopes(num_heads)
    else:
        # The reference implementation: the closest lower power of two, then every other
        # slope of twice that many heads.
        closest = 2 ** math.floor(math.log2(num_heads))
        slopes = _power_of_two_slopes(closest) + _power_of_two_slopes(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(positions: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """-slope_h * |p_i - p_j|: positions [s] -> [1, h, s, s]; [b, s] -> [b, h, s, s] (float32)."""
    if positions.dim() not in (1, 2):
        raise ValueError(f"ALiBi positions must be [s] or [b, s] (got shape {tuple(positions.shape)})")
    p = positions.to(torch.float32)
    p = p[None] if p.dim() == 1 else p
    distance = (p[:, :, None] - p[:, None, :]).abs()  # [b|1, s, s]
    slopes = slopes.to(device=p.device, dtype=torch.float32)
    return -slopes[None, :, None, None] * distance[:, None]
