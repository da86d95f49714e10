"""Training-time RoPE position strategies (PosAug, random base, RFS, RPE, index warping, PoSE, Randomized YaRN:
randomized_yarn.py, its recipe and choices), and the position rules of the model options p-RoPE,
NoPE-interleaved layers with attention temperature and SSMax.

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
  Eq. 8): the window, or the sequence's own length when training is given lengths;
  head and tail are exclusive per sample (p_head + p_tail <= 1);
  evaluation uses PI at train_len / eval_len, never stretching shorter inputs.
- YaRN attention factor is transformers' mscale 0.1 ln(s) + 1 (multiplies cos and
  sin). The PosAug paper's "sqrt(1 + 0.1 ln s)" wording is not what HF computes.
- dynamic_ntk with factor None uses factor 1: HF's dynamic formula already scales
  with seq_len / original length, so deriving the factor from it would count twice.
- Layout invariance: every draw is keyed on (seed, optimizer step) and, for
  positions.granularity=per_sample, the sequence's index in the step's global batch;
  never on TP/PP/DP/CP sizes, micro-batch size or gradient-accumulation count. The
  same run on 1 or 64 GPUs draws the same positions for the same sequence.
- Granularity defaults follow the papers: PosAug, random_base and RPE ("per batch")
  per_step; RFS (per sequence) and index warping ("a fraction of instances")
  per_sample. per_sample positions are [b, s] and force unfused RoPE.
- posaug per_sample draws one alpha per sequence (per layer and sequence in
  layer_mode=independent); random_base per_sample gives inv_freq [b, d/2]; cycle
  (one alpha per step by definition) requires per_step.
- Right-padded variable-length data (training(..., lengths=)): per_sample rfs / rpe /
  warp draw at the window size as always and use the first n_b draws (RFS), the
  n_b largest keys (RPE) or l = n_b (warp tail), so a length-n example gets what
  its paper gives a length-n sequence; padding positions are finite (L, or the
  tail's l) and never reach a real token under causal attention.
"""

from .config import (ALPHA_DISTRIBUTIONS, CURRICULA, DEFAULT_GRANULARITY, GRANULARITIES, LAYER_MODES,
                     STRATEGIES, TAIL_FUNCTIONS, PositionConfig)
from .scaling import HF_ROPE_TYPE, ROPE_SCALING_ALIASES, ROPE_SCALING_KINDS, RopeScaling, scaling_kind

# The rest import torch, so they load on first use: a config check (`train --check`, the launchers' dry runs)
# reads only the names above and starts without torch.
_LAZY = {"attention_temperature": "nope_interleave", "nope_layers": "nope_interleave", "pose_positions": "pose",
         "kept_frequencies": "prope", "prope_inv_freq": "prope", "position_generator": "rng",
         "RopePositions": "rope_positions", "PositionSampler": "sampler", "build_sampler": "sampler",
         "llama3_inv_freq": "scaling", "rope_inv_freq": "scaling", "scaled_inv_freq": "scaling",
         "ssmax_factor": "ssmax"}


def __getattr__(name: str):
    """The torch-using names of the package, imported when first read."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "ALPHA_DISTRIBUTIONS",
    "CURRICULA",
    "DEFAULT_GRANULARITY",
    "GRANULARITIES",
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
    "attention_temperature",
    "build_sampler",
    "kept_frequencies",
    "nope_layers",
    "pose_positions",
    "prope_inv_freq",
    "ssmax_factor",
    "llama3_inv_freq",
    "position_generator",
    "rope_inv_freq",
    "scaled_inv_freq",
    "scaling_kind",
]
