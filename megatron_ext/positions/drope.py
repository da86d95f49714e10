"""DroPE (Gelberg, Eguchi, Akiba, Cetin, "Extending the Context of Pretrained LLMs by Dropping Their Positional
Embeddings", arXiv 2512.12167, ICLR 2026; code: github.com/SakanaAI/DroPE): pretrain with RoPE, then remove every
positional embedding and recalibrate briefly at the original context, then evaluate zero-shot past the window with no
positional embedding at all. Strategy `drope`.

The recipe implemented (the paper's main one, the authors' `attention_type: nope`):
- Dropping: from the switch step on, every layer's q and k go unrotated. The authors' code keeps the RoPE model and
  replaces its cos / sin by ones / zeros (an identity rotation) in every attention layer; here every position becomes
  0, whose angles are 0, so cos = 1 and sin = 0 in every layer, on every RoPE path (unfused, Triton, TE, THD): the
  same identity rotation, no weight added or removed, so a RoPE checkpoint loads as it is.
- Nothing else of the architecture changes: the authors' nope recipe keeps the softmax scale 1/sqrt(d) (their
  optional `softmax_scale` override is unset in every shipped recipe) and adds no norm. Their QK-norm variant
  (`qk_norm_nope`: new RMSNorms on q and k, for recalibrating at a higher learning rate) is not the main recipe and
  is not implemented; model.qk_layernorm on a model trained with it stays as it was.
- Recalibration at the original context: the same window, data and loss as pretraining.
- Learning rate: the authors' recalibration is a new run (weights only, a fresh AdamW, warmup then decay: Llama-2-7B
  100 warmup steps then cosine; SmolLM-1.7B warmup-stable-decay). Two ways in here:
  * checkpoint.load=<a RoPE checkpoint> with positions.drope_share=1: a new run initialised from the weights only
    (fresh optimizer and schedule), every step of it recalibration: the paper's procedure exactly, on a trained
    baseline or a PosAug run.
  * one run that switches: the last drope_share of the optimizer steps recalibrate, so the run's token budget counts
    the recalibration tokens and equals the baseline's. At the switch the learning-rate schedule restarts: the run's
    own schedule (warmup share, decay style, peak and minimum LR) replayed over the recalibration steps
    (pretrain/trainer/recalibration.py). The Adam moments are kept (a deviation: the authors' new run starts a fresh
    optimizer; the re-warm-up is what keeps the first NoPE updates small either way).
- Inference and evaluation: positions are never used; every layer without RoPE, at any length, with no scaling
  (positions.rope_scaling and eval's --rope-scaling are refused: there is no rotation to scale). A checkpoint saved
  before the switch is a RoPE model and is evaluated as one (phase "pretraining").

The recalibration share (positions.drope_share, default 0.02): the paper reports recalibrating on 0.5-2 % of the
pretraining tokens (the authors' Llama-2-7B recipe: 5,000 steps x 512 x 4,096 = 10.5B tokens of its 2T, 0.5 %; its
QK-norm recipe 30B, 1.5 %). Runs trained from scratch here are short and far from converged, where a fixed share of
their tokens is a small absolute count; the default takes the top of the paper's range, 2 %, and the table's
`drope_2x` row measures twice that. The count is rounded half up and at least one step.

Pretraining strategy (positions.drope_pretraining): none (plain RoPE, the paper) or posaug (PosAug's alpha * i with
the posaug fields, the row posaug_drope); before the switch the positions are bitwise those of that strategy's run.

Outside the recipe, refused in one line: sliding-window hybrids (model.window_size: the paper drops the positional
embeddings of full-attention models, and compares against RNoPE-SWA as a different architecture), models without
RoPE (nothing to drop), any positions.rope_scaling.

Randomness contract: dropping draws nothing. Before the switch the pretraining strategy's draws (keyed on seed and
step) are used; the switch step is a function of total_steps and the share only, so every rank and a resumed run
agree on it. Cost contract: one zeros tensor per microbatch after the switch, no host sync.
"""

from __future__ import annotations

import math

DEFAULT_SHARE = 0.02  # the top of the paper's 0.5-2 % recalibration budget (see above)
PRETRAINING = ("none", "posaug")
PHASES = ("pretraining", "recalibration")


def recalibration_steps(total_steps: int, share: float) -> int:
    """Optimizer steps of the recalibration: share x total_steps rounded half up, at least 1, at most total_steps."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1 (got {total_steps})")
    return min(total_steps, max(1, math.floor(share * total_steps + 0.5)))


def switch_step(total_steps: int, share: float) -> int:
    """The first optimizer step without RoPE (0: every step recalibrates, as a run from checkpoint.load)."""
    return total_steps - recalibration_steps(total_steps, share)


def run_phase(positions, trained_steps: int | None, total_steps: int) -> str | None:
    """The phase of a checkpoint of a run with these positions after `trained_steps` steps; None unless DroPE."""
    if positions.strategy != "drope":
        return None
    return phase(trained_steps or 0, total_steps, positions.drope_share)


def phase(trained_steps: int, total_steps: int, share: float) -> str:
    """'pretraining' for a checkpoint after `trained_steps` steps that never trained without RoPE, else
    'recalibration'."""
    return "recalibration" if trained_steps > switch_step(total_steps, share) else "pretraining"
