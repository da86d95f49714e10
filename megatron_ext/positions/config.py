"""`PositionConfig`: the flat, validated `positions.*` section of a training config."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from . import drope
from .randomized_yarn import DEFAULT_STAGES, INFERENCE_KINDS, inference_factor
from .scaling import ROPE_SCALING_KINDS

STRATEGIES = ("none", "posaug", "random_base", "rfs", "rpe", "warp", "pose", "ryarn", "drope")
ALPHA_DISTRIBUTIONS = ("uniform", "log_uniform", "discrete", "cycle", "fixed")
CURRICULA = ("none", "linear", "step")
LAYER_MODES = ("all", "bottom", "top", "independent", "global")
TAIL_FUNCTIONS = ("sqrt", "beta_2_5")
GRANULARITIES = ("per_step", "per_sample")
# What each strategy's paper does when positions.granularity is not set: PosAug draws alpha
# per step and Ruoss et al. (RPE) "per batch"; RFS samples per sequence; index warping
# warps "a fraction of instances"; PoSE draws its chunks and biases per training example; Randomized YaRN assigns
# its sampled positions per batch; DroPE pretrains with plain RoPE (or PosAug, per step).
DEFAULT_GRANULARITY = {"none": "per_step", "posaug": "per_step", "random_base": "per_step",
                       "rfs": "per_sample", "rpe": "per_step", "warp": "per_sample", "pose": "per_sample",
                       "ryarn": "per_step", "drope": "per_step"}

# Positions are float32; integers above 2**24 are no longer exactly representable.
MAX_POSITION_LIMIT = 2**24


def _show(value: object) -> str:
    # Floats print like the user wrote them (-1, not -1.0); strings keep their quotes.
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return "(" + ", ".join(_show(v) for v in value) + ")"
    return repr(value)


def _err(field: str, requirement: str, value: object) -> ValueError:
    return ValueError(f"positions.{field} must be {requirement} (got {_show(value)})")


def _choice(field: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"positions.{field} must be one of {', '.join(choices)} (got {value!r})")
    return value  # type: ignore[return-value]


def _float(field: str, value: object) -> float:
    # Accept ints and numeric strings (command-line --set overrides arrive as text).
    if isinstance(value, bool):
        raise _err(field, "a number", value)
    try:
        result = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise _err(field, "a number", value) from None
    if not math.isfinite(result):
        raise _err(field, "finite", value)
    return result


def _int(field: str, value: object) -> int:
    if isinstance(value, bool):
        raise _err(field, "an integer", value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise _err(field, "an integer", value) from None


def _bool(field: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    raise _err(field, "a boolean", value)


def _floats(field: str, value: object) -> tuple[float, ...]:
    # YAML gives lists; "1,2,4" strings come from --set.
    if isinstance(value, str):
        value = [v for v in value.replace("[", "").replace("]", "").split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or len(value) == 0:
        raise _err(field, "a non-empty list of numbers", value)
    return tuple(_float(field, v) for v in value)


@dataclass
class PositionConfig:
    """Position strategy and its hyperparameters (YAML keys `positions.<field>`)."""

    strategy: str = "none"  # none | posaug | random_base | rfs | rpe | warp | pose | ryarn | drope
    # per_step: one draw shared by the whole global batch of an optimizer step; per_sample: one
    # draw per sequence, keyed by its index in the global batch. None = the strategy's paper
    # default (DEFAULT_GRANULARITY). per_sample positions are [b, s] and use unfused RoPE.
    granularity: str | None = None  # per_step | per_sample

    # posaug: alpha is drawn once per optimizer step and scales positions to alpha * i.
    alpha_min: float = 0.125
    alpha_max: float = 8.0
    alpha_distribution: str = "uniform"  # uniform | log_uniform | discrete | cycle | fixed
    alpha_values: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)  # discrete set / cycle order
    alpha_fixed: float = 1.0
    # Curricula (paper §4.8). linear: U[lo(t), hi(t)] with the range moving linearly from
    # [curriculum_start_min, curriculum_start_max] at step 0 to [alpha_min, alpha_max] at the
    # last step ("over training"; curriculum_fraction is NOT used). step: alpha = 1 for the
    # first curriculum_fraction of total_steps, then the configured distribution.
    curriculum: str = "none"  # none | linear | step
    curriculum_start_min: float = 0.5
    curriculum_start_max: float = 2.0
    curriculum_fraction: float = 0.5
    # Per-layer scaling (paper §4.10): bottom/top scale only the first/last layer_count layers; global only the
    # full-attention RoPE layers of a model with sliding-window layers (model.window_size), local ones keep i.
    layer_mode: str = "all"  # all | bottom | top | independent | global
    layer_count: int = 0

    # random_base: RoPE base B ~ U[base_min_factor * B0, base_max_factor * B0] per step.
    base_min_factor: float = 0.125
    base_max_factor: float = 8.0

    # rfs (scale L of the [0, 1) range) / rpe (integers drawn from {0..L-1}) / pose (target length L) /
    # ryarn (the curriculum's final range L).
    max_position: int = 1000
    pose_chunks: int = 2  # pose: chunks of the window, each with its own skipping bias (PoSE's N)
    # ryarn (Randomized YaRN, megatron_ext/positions/randomized_yarn.py): YaRN scale s (None = max_position / window)
    # and the length curriculum: stage k of equal shares of the run draws from {0..L_k-1}, L_k = w + f_k (L - w).
    ryarn_factor: float | None = None
    ryarn_stages: tuple[float, ...] = DEFAULT_STAGES
    # drope (DroPE, megatron_ext/positions/drope.py): the last drope_share of the optimizer steps train without
    # RoPE (1 = every step: a recalibration run from checkpoint.load); before them the drope_pretraining strategy.
    drope_share: float = drope.DEFAULT_SHARE
    drope_pretraining: str = "none"  # none | posaug
    # Legacy spelling of granularity (configs saved before it existed): true = per_sample,
    # false = per_step. Folded into granularity and reset to None on construction.
    per_sample: bool | None = None

    # warp (position index warping): per sample, head with p_head, tail with p_tail.
    p_head: float = 0.15
    head_alphas: tuple[float, ...] = (0.4, 0.5, 0.6, 0.7, 0.8)
    head_alpha_fixed: float | None = None
    p_tail: float = 0.15
    tail_function: str = "sqrt"  # sqrt | beta_2_5

    # Inference-time transform applied by PositionSampler.evaluation on top of the strategy.
    rope_scaling: str = "none"  # none | pi | ntk | dynamic_ntk | yarn | llama3
    rope_scaling_factor: float | None = None  # None -> eval_len / train_len

    def __post_init__(self) -> None:
        self.strategy = _choice("strategy", self.strategy, STRATEGIES)

        self.alpha_min = _float("alpha_min", self.alpha_min)
        if self.alpha_min <= 0:
            raise _err("alpha_min", "> 0", self.alpha_min)
        self.alpha_max = _float("alpha_max", self.alpha_max)
        if self.alpha_max < self.alpha_min:
            raise ValueError(
                f"positions.alpha_max must be >= positions.alpha_min={_show(self.alpha_min)} "
                f"(got {_show(self.alpha_max)})"
            )
        self.alpha_distribution = _choice("alpha_distribution", self.alpha_distribution, ALPHA_DISTRIBUTIONS)
        self.alpha_values = _floats("alpha_values", self.alpha_values)
        if min(self.alpha_values) <= 0:
            raise _err("alpha_values", "all > 0", self.alpha_values)
        self.alpha_fixed = _float("alpha_fixed", self.alpha_fixed)
        if self.alpha_fixed <= 0:
            raise _err("alpha_fixed", "> 0", self.alpha_fixed)

        self.curriculum = _choice("curriculum", self.curriculum, CURRICULA)
        self.curriculum_start_min = _float("curriculum_start_min", self.curriculum_start_min)
        if self.curriculum_start_min <= 0:
            raise _err("curriculum_start_min", "> 0", self.curriculum_start_min)
        self.curriculum_start_max = _float("curriculum_start_max", self.curriculum_start_max)
        if self.curriculum_start_max < self.curriculum_start_min:
            raise ValueError(
                "positions.curriculum_start_max must be >= positions.curriculum_start_min="
                f"{_show(self.curriculum_start_min)} (got {_show(self.curriculum_start_max)})"
            )
        self.curriculum_fraction = _float("curriculum_fraction", self.curriculum_fraction)
        if not 0.0 <= self.curriculum_fraction <= 1.0:
            raise _err("curriculum_fraction", "in [0, 1]", self.curriculum_fraction)
        if self.curriculum == "linear" and self.alpha_distribution not in ("uniform", "log_uniform"):
            raise ValueError(
                "positions.curriculum=linear widens the [alpha_min, alpha_max] range, so "
                "positions.alpha_distribution must be uniform or log_uniform "
                f"(got {self.alpha_distribution!r})"
            )

        self.layer_mode = _choice("layer_mode", self.layer_mode, LAYER_MODES)
        self.layer_count = _int("layer_count", self.layer_count)
        if self.layer_count < 0:
            raise _err("layer_count", ">= 0", self.layer_count)
        if self.layer_mode in ("bottom", "top") and self.layer_count < 1:
            raise ValueError(
                f"positions.layer_count must be >= 1 with positions.layer_mode={self.layer_mode} "
                f"(got {self.layer_count})"
            )
        if self.layer_mode != "all" and self.strategy != "posaug":
            raise ValueError(
                f"positions.layer_mode={self.layer_mode} only applies to strategy posaug "
                f"(got strategy {self.strategy!r}); use layer_mode=all"
            )
        if self.layer_mode == "independent" and self.alpha_distribution in ("cycle", "fixed"):
            raise ValueError(
                "positions.layer_mode=independent draws one random alpha per layer, so "
                "positions.alpha_distribution must be uniform, log_uniform or discrete "
                f"(got {self.alpha_distribution!r})"
            )

        self.base_min_factor = _float("base_min_factor", self.base_min_factor)
        if self.base_min_factor <= 0:
            raise _err("base_min_factor", "> 0", self.base_min_factor)
        self.base_max_factor = _float("base_max_factor", self.base_max_factor)
        if self.base_max_factor < self.base_min_factor:
            raise ValueError(
                "positions.base_max_factor must be >= positions.base_min_factor="
                f"{_show(self.base_min_factor)} (got {_show(self.base_max_factor)})"
            )

        self.max_position = _int("max_position", self.max_position)
        if not 1 <= self.max_position <= MAX_POSITION_LIMIT:
            raise _err("max_position", f"in [1, {MAX_POSITION_LIMIT}] (float32 positions)", self.max_position)

        self.pose_chunks = _int("pose_chunks", self.pose_chunks)
        if self.pose_chunks < 1:
            raise _err("pose_chunks", ">= 1", self.pose_chunks)

        self.p_head = _float("p_head", self.p_head)
        if not 0.0 <= self.p_head <= 1.0:
            raise _err("p_head", "a probability in [0, 1]", self.p_head)
        self.p_tail = _float("p_tail", self.p_tail)
        if not 0.0 <= self.p_tail <= 1.0:
            raise _err("p_tail", "a probability in [0, 1]", self.p_tail)
        if self.p_head + self.p_tail > 1.0:
            raise ValueError(
                "positions.p_head + positions.p_tail must be <= 1 (head and tail warping are "
                f"exclusive per sample) (got {_show(self.p_head)} + {_show(self.p_tail)})"
            )
        self.head_alphas = _floats("head_alphas", self.head_alphas)
        if not all(0 < a <= 1 for a in self.head_alphas):
            raise _err("head_alphas", "all in (0, 1] (head warping down-scales positions)", self.head_alphas)
        if self.head_alpha_fixed is not None:
            self.head_alpha_fixed = _float("head_alpha_fixed", self.head_alpha_fixed)
            if not 0 < self.head_alpha_fixed <= 1:
                raise _err("head_alpha_fixed", "None or in (0, 1]", self.head_alpha_fixed)
        self.tail_function = _choice("tail_function", self.tail_function, TAIL_FUNCTIONS)

        self.rope_scaling = _choice("rope_scaling", self.rope_scaling, ROPE_SCALING_KINDS)
        if self.rope_scaling_factor is not None:
            self.rope_scaling_factor = _float("rope_scaling_factor", self.rope_scaling_factor)
            if self.rope_scaling_factor < 1:
                raise _err("rope_scaling_factor", "None or >= 1", self.rope_scaling_factor)
        self._check_ryarn()
        self._check_drope()
        self._resolve_granularity()

    def _check_ryarn(self) -> None:
        if self.ryarn_factor is not None:
            self.ryarn_factor = _float("ryarn_factor", self.ryarn_factor)
            if self.ryarn_factor < 1:
                raise _err("ryarn_factor", "None or >= 1 (YaRN's scale)", self.ryarn_factor)
        self.ryarn_stages = _floats("ryarn_stages", self.ryarn_stages)
        if not all(0.0 <= f <= 1.0 for f in self.ryarn_stages):
            raise _err("ryarn_stages", "all in [0, 1] (0 = the window, 1 = max_position)", self.ryarn_stages)
        if any(b < a for a, b in zip(self.ryarn_stages, self.ryarn_stages[1:])):
            raise _err("ryarn_stages", "non-decreasing (a length curriculum widens the range)", self.ryarn_stages)
        if self.strategy == "ryarn" and self.rope_scaling not in INFERENCE_KINDS:
            raise ValueError(f"positions.rope_scaling={self.rope_scaling} would replace the YaRN that strategy ryarn "
                             "trains with: use none (its own YaRN) or yarn with a larger rope_scaling_factor")

    def _check_drope(self) -> None:
        self.drope_share = _float("drope_share", self.drope_share)
        if not 0.0 < self.drope_share <= 1.0:
            raise _err("drope_share", "in (0, 1] (the share of the run's steps that recalibrate without RoPE)",
                       self.drope_share)
        self.drope_pretraining = _choice("drope_pretraining", self.drope_pretraining, drope.PRETRAINING)
        if self.strategy == "drope" and self.rope_scaling != "none":
            raise ValueError(f"positions.rope_scaling={self.rope_scaling} scales RoPE, which strategy drope removes "
                             "from every layer after its switch: use rope_scaling=none")

    def pretraining_strategy(self) -> str:
        """The strategy whose positions a run trains with before any DroPE switch (the strategy itself otherwise)."""
        return self.drope_pretraining if self.strategy == "drope" else self.strategy

    def _resolve_granularity(self) -> None:
        if self.granularity is not None:
            self.granularity = _choice("granularity", self.granularity, GRANULARITIES)
        if self.per_sample is not None:
            legacy = "per_sample" if _bool("per_sample", self.per_sample) else "per_step"
            if self.granularity not in (None, legacy):
                raise ValueError(
                    f"positions.per_sample={str(legacy == 'per_sample').lower()} contradicts "
                    f"positions.granularity={self.granularity}; drop positions.per_sample (it is the "
                    "old spelling of positions.granularity)")
            self.granularity, self.per_sample = legacy, None
        if self.granularity is None:
            self.granularity = DEFAULT_GRANULARITY[self.strategy]
        if (self.granularity == "per_sample" and self.pretraining_strategy() == "posaug"
                and self.alpha_distribution == "cycle"):
            raise ValueError(
                "positions.alpha_distribution=cycle walks alpha_values one per optimizer step, so "
                "positions.granularity must be per_step (got per_sample)")

    def validate_for(self, seq_len: int) -> None:
        """Check settings that depend on the sequence length (raises ValueError)."""
        if seq_len < 1:
            raise ValueError(f"sequence length must be >= 1 (got {seq_len})")
        if self.strategy == "rpe" and self.max_position < seq_len:
            raise ValueError(
                f"positions.max_position must be >= the sequence length for strategy rpe "
                f"(got {self.max_position} < seq_len {seq_len}): RPE draws {seq_len} distinct "
                f"positions from {{0..max_position-1}}; set positions.max_position to at least "
                f"{seq_len} (ideally the longest evaluation length)"
            )

        if self.strategy == "ryarn":
            if self.max_position < seq_len:
                raise ValueError(
                    f"positions.max_position must be >= the sequence length for strategy ryarn (got "
                    f"{self.max_position} < seq_len {seq_len}): it is the largest range positions are drawn from; "
                    f"set it to at least {seq_len} (the table uses 8 x the window)")
            inference_factor(self.ryarn_scale(seq_len), self.rope_scaling, self.rope_scaling_factor)

        if self.strategy == "pose" and not self.pose_chunks <= seq_len <= self.max_position:
            raise ValueError(
                f"positions.max_position (the target length, {self.max_position}) must be >= the sequence length "
                f"{seq_len} >= positions.pose_chunks ({self.pose_chunks}) for strategy pose; set "
                "positions.max_position to the length the model should reach")

    def ryarn_scale(self, train_seq_len: int) -> float:
        """Randomized YaRN's scale s for training window `train_seq_len`: ryarn_factor, else max_position / window."""
        return self.ryarn_factor if self.ryarn_factor is not None else self.max_position / train_seq_len

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Names accepted as `positions.<name>` keys."""
        return tuple(f.name for f in fields(cls))
