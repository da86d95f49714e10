"""Randomized YaRN (Mehta, Yin, Durrett, "Randomized YaRN Improves Length Generalization for Long-Context
Reasoning", arXiv 2606.23687, June 2026): YaRN-scaled RoPE whose training positions are a sorted random subset
of a range larger than the window (Ruoss et al.'s randomized positional encodings), with a length curriculum
that widens the range over training. Strategy `ryarn`.

The recipe implemented (the paper's main one):
- Positions: each training step draws seq_len distinct integers from {0, ..., L_t - 1} uniformly (a uniform
  seq_len-subset, without replacement) and sorts them: Ruoss et al.'s RPE, which the paper takes over. The paper
  writes the range as [1, L_t]; a constant shift of every position leaves RoPE's relative rotations, and so the
  model, unchanged, and 0-based keeps L_t = w equal to plain positions 0..w-1 bit for bit.
- One draw per batch (Ruoss et al.'s "once per batch", the paper's per-batch assignment): positions.granularity
  defaults to per_step, one row shared by the whole global batch of an optimizer step; per_sample draws one row
  per sequence (keyed by its global index), as for RPE.
- YaRN: every position, in training and at inference, is rotated with YaRN's NTK-by-parts frequencies and
  attention factor at one scale s (scaling.scaled_inv_freq with kind yarn, original window = the training
  window w): the one RoPE-scaling vocabulary, so with the range held at w this strategy is YaRN exactly.
- Length curriculum: the largest sampled position L_t grows in stages (the paper's example: 8K -> 10K -> 12K ->
  16K -> 16K over five epochs of 8K data). positions.ryarn_stages lists each stage's place between the window
  and the final range, L_t = w + f_k (L - w), L = positions.max_position; the stages split the run's optimizer
  steps into equal shares (stage k = floor(step * K / total_steps)). The default (0, 0.25, 0.5, 1, 1) is the
  paper's example written that way (8K + f · 8K).
- Inference: no sampling; positions 0..n-1 with YaRN at s, or at a larger s' (the paper's s' >= s) given as
  positions.rope_scaling=yarn with positions.rope_scaling_factor (or eval's --rope-scaling yarn --factor).

Where the paper is silent, or fine-tunes where we pretrain, our choices:
- YaRN factor: s = L / w by default (positions.ryarn_factor overrides it), YaRN's own definition of the factor
  (target length over original window): the largest training position then lands, in the interpolated
  dimensions, where w - 1 lands without scaling. The paper fine-tunes 7B models with their own context, which
  has no counterpart in a run trained from scratch; here the training window is YaRN's original window.
- Range: L = 8w in the table's row (pretrain.table.EXTRAPOLATION), the range RPE and RFS draw from, PosAug's
  α·i reaches and the LM table evaluates at.
- Epochs become equal shares of one pretraining run (pretraining makes one pass over the data).
- Other inference scalings (PI, NTK, Llama 3) on top of a model trained with YaRN are refused, and so is an
  inference factor below s: the paper evaluates with YaRN at s' >= s only.

Randomness contract (rng.py, draws.py): the draw is a pure function of (seed, optimizer step) and, per_sample,
the sequence's index in the step's global batch, made on STREAM_POSITIONS; the stage is a function of the step
and the run's total_steps. Nothing depends on the parallel layout; every rank computes the same positions without
communication, and a resumed run draws the same positions bitwise.

Cost contract: L_t uniforms, one topk and one sort on the requested device per step (per sequence per_sample),
as RPE; the stage and L_t are host integers. The YaRN frequencies are a constant of the run, built once per
device; nothing reads a device tensor back to the host.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .scaling import RopeScaling, scaled_inv_freq

if TYPE_CHECKING:
    import torch

# The paper's curriculum 8K -> 10K -> 12K -> 16K -> 16K for 8K data: each stage's place between w and L.
DEFAULT_STAGES = (0.0, 0.25, 0.5, 1.0, 1.0)
# What a model trained with YaRN may be evaluated with: its own YaRN (none) or YaRN at a factor s' >= s.
INFERENCE_KINDS = ("none", "yarn")


def stage(step: int, total_steps: int, num_stages: int) -> int:
    """The curriculum stage of optimizer step `step`: equal shares of total_steps, the last one kept after it."""
    return min(num_stages - 1, step * num_stages // max(1, total_steps))


def position_range(step: int, total_steps: int, train_seq_len: int, max_position: int,
                   stages: tuple[float, ...]) -> int:
    """L_t: positions of step `step` are drawn from {0..L_t-1}, L_t = w + f_k (L - w) at stage k."""
    fraction = stages[stage(step, total_steps, len(stages))]
    # Round half up: exact for the default fractions of any integer L - w, and the same on every host.
    return train_seq_len + math.floor(fraction * (max_position - train_seq_len) + 0.5)


def yarn_frequencies(rotary_dim: int, rotary_base: float, factor: float, train_seq_len: int,
                     device: torch.device | str | None = None) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention_factor) of YaRN at scale `factor` over the window: scaling.scaled_inv_freq's."""
    scaling = RopeScaling(kind="yarn", factor=factor, original_max_position_embeddings=train_seq_len)
    return scaled_inv_freq(rotary_dim, rotary_base, scaling, train_seq_len, device)


def inference_factor(factor: float, kind: str | None, inference: float | None, *,
                     kind_name: str = "positions.rope_scaling",
                     factor_name: str = "positions.rope_scaling_factor") -> float:
    """The YaRN scale a ryarn model trained at `factor` is evaluated at: its own s (kind none), or YaRN at
    s' = `inference` >= s; ValueError naming `kind_name` / `factor_name` otherwise."""
    kind = kind or "none"
    if kind not in INFERENCE_KINDS:
        raise ValueError(f"{kind_name}={kind} would replace the YaRN a ryarn model trained with (s = {factor:g}): "
                         f"drop it (the model evaluates with its own YaRN), or use yarn with {factor_name} "
                         f">= {factor:g}")
    if kind == "none":
        return factor
    if inference is None or not inference >= factor:
        raise ValueError(f"{factor_name} must be >= the YaRN factor s = {factor:g} a ryarn model trained with "
                         f"(the paper evaluates at s' >= s) with {kind_name}=yarn (got {inference})")
    return float(inference)
