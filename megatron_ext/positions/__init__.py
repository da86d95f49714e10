"""Training-time RoPE position strategies (PosAug, random base, RFS, RPE, index warping).

Pure torch: nothing here imports Megatron. The RoPE hook consumes `RopePositions`.

Decisions where the sources leave room (each is tested):
- PosAug linear curriculum: U[lo(t), hi(t)] with the range moving linearly from
  [curriculum_start_min, curriculum_start_max] (default [1/2, 2]) at step 0 to
  [alpha_min, alpha_max] at step total_steps - 1, i.e. "over training" as in the
  paper's §4.8. `curriculum_fraction` only drives the step curriculum (alpha = 1
  for step < fraction * total_steps).
- PosAug layer modes other than `all` fill `layer_positions` for every layer and
  leave `positions` = arange. `independent` draws one alpha per layer per step
  from the configured distribution (uniform / log_uniform / discrete).
- RPE evaluation follows Ruoss et al. (same random procedure at test time) with a
  fixed evaluation stream, so every evaluation of a run sees the same positions.
- Warp tail: pos(j) = l * f(j / l) with l = the sequence length (warping paper
  Eq. 8); head and tail are exclusive per sample (p_head + p_tail <= 1);
  evaluation uses PI at train_len / eval_len, never stretching shorter inputs.
- YaRN attention factor is transformers' mscale 0.1 ln(s) + 1 (multiplies cos and
  sin). The PosAug paper's "sqrt(1 + 0.1 ln s)" wording is not what HF computes.
- dynamic_ntk with factor None uses factor 1: HF's dynamic formula already scales
  with seq_len / original length, so deriving the factor from it would count twice.
- Per-sample positions ([b, s]) are keyed by (seed, step, microbatch) like
  everything else, so data-parallel ranks use the same per-sample rows for their
  (different) samples.
"""

from .config import (ALPHA_DISTRIBUTIONS, CURRICULA, LAYER_MODES, STRATEGIES, TAIL_FUNCTIONS,
                     PositionConfig)
from .rng import position_generator
from .rope_positions import RopePositions
from .sampler import PositionSampler, build_sampler
from .scaling import (HF_ROPE_TYPE, ROPE_SCALING_ALIASES, ROPE_SCALING_KINDS, RopeScaling, rope_inv_freq,
                      scaled_inv_freq, scaling_kind)

__all__ = [
    "ALPHA_DISTRIBUTIONS",
    "CURRICULA",
    "LAYER_MODES",
    "HF_ROPE_TYPE",
    "ROPE_SCALING_ALIASES",
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
    "scaling_kind",
]
