"""Training-time RoPE position strategies (PosAug, random base, RFS, RPE, index warping).

Pure torch: nothing here imports Megatron. The RoPE hook consumes `RopePositions`.
"""

from .config import (ALPHA_DISTRIBUTIONS, CURRICULA, LAYER_MODES, STRATEGIES, TAIL_FUNCTIONS,
                     PositionConfig)
from .rng import position_generator
from .rope_positions import RopePositions
from .sampler import PositionSampler, build_sampler
from .scaling import ROPE_SCALING_KINDS, RopeScaling, rope_inv_freq, scaled_inv_freq

__all__ = [
    "ALPHA_DISTRIBUTIONS",
    "CURRICULA",
    "LAYER_MODES",
    "ROPE_SCALING_KINDS",
    "STRATEGIES",
    "TAIL_FUNCTIONS",
    "PositionConfig",
    "PositionSampler",
    "RopePositions",
    "RopeScaling",
    "build_sampler",
    "position_generator",
    "rope_inv_freq",
    "scaled_inv_freq",
]
