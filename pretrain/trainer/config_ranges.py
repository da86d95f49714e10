"""The range every numeric config field must lie in, checked when the config is loaded (before `validate`,
`train --check` or any process group), so a value that cannot work is one line naming the field instead of a
ZeroDivisionError after step 1 (logging.log_interval=0) or torch's traceback at the optimizer (lr=nan).

Every int/float field of every section has an entry here (tests/trainer/test_config_ranges.py walks them), so
a new numeric field must say what it accepts. Rules between fields (min_lr <= lr, alpha_max >= alpha_min, ...)
stay in the sections' own __post_init__ checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """low/high bounds (None = unbounded), each inclusive or not."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        """True when `value` lies in the range (nan never does)."""
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {_show(self.low)}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {_show(self.high)}"
        return (f"in {'(' if self.low_open else '['}{_show(self.low)}, {_show(self.high)}"
                f"{')' if self.high_open else ']'}")


def _show(value: float | None) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


AT_LEAST_1 = Range(1)
AT_LEAST_0 = Range(0)
POSITIVE = Range(0.0, low_open=True)
FRACTION = Range(0.0, 1.0)
BELOW_1 = Range(0.0, 1.0, high_open=True)  # dropouts, Adam's betas

RANGES: dict[str, Range] = {
    "seed": Range(0, 2**32 - 1),  # numpy's seed range; Megatron adds small offsets per rank
    # model
    "model.num_layers": AT_LEAST_1, "model.hidden_size": AT_LEAST_1, "model.ffn_hidden_size": AT_LEAST_1,
    "model.num_attention_heads": AT_LEAST_1, "model.num_query_groups": AT_LEAST_1, "model.kv_channels": AT_LEAST_1,
    "model.seq_length": AT_LEAST_1, "model.vocab_size": AT_LEAST_1, "model.make_vocab_size_divisible_by": AT_LEAST_1,
    "model.rotary_base": Range(1.0, low_open=True), "model.layernorm_epsilon": POSITIVE,
    "model.init_method_std": POSITIVE, "model.hidden_dropout": BELOW_1, "model.attention_dropout": BELOW_1,
    "model.recompute_num_layers": AT_LEAST_1, "model.rope_scaling_factor": POSITIVE,
    "model.rope_scaling_low_freq_factor": POSITIVE, "model.rope_scaling_high_freq_factor": POSITIVE,
    "model.rope_scaling_original_max_position_embeddings": AT_LEAST_1, "model.rope_proportion": FRACTION,
    "model.no_rope_freq": AT_LEAST_1, "model.attn_temperature_beta": Range(0.0),
    "model.attn_temperature_floor": AT_LEAST_1, "model.ssmax_scale": POSITIVE,
    "model.window_size": AT_LEAST_1, "model.window_attn_skip_freq": AT_LEAST_1,
    "model.rotary_base_local": Range(1.0, low_open=True),
    # parallel
    "parallel.tensor_model_parallel_size": AT_LEAST_1, "parallel.pipeline_model_parallel_size": AT_LEAST_1,
    "parallel.context_parallel_size": AT_LEAST_1, "parallel.virtual_pipeline_model_parallel_size": AT_LEAST_1,
    "parallel.distributed_timeout_minutes": AT_LEAST_1, "parallel.train_timeout_seconds": POSITIVE,
    # positions (their cross-field rules: megatron_ext/positions/config.py)
    "positions.alpha_min": POSITIVE, "positions.alpha_max": POSITIVE, "positions.alpha_fixed": POSITIVE,
    "positions.curriculum_start_min": POSITIVE, "positions.curriculum_start_max": POSITIVE,
    "positions.curriculum_fraction": FRACTION, "positions.layer_count": AT_LEAST_0,
    "positions.base_min_factor": POSITIVE, "positions.base_max_factor": POSITIVE,
    "positions.max_position": AT_LEAST_1, "positions.pose_chunks": AT_LEAST_1, "positions.p_head": FRACTION,
    "positions.p_tail": FRACTION, "positions.head_alpha_fixed": Range(0.0, 1.0, low_open=True),
    "positions.ryarn_factor": Range(1.0), "positions.drope_share": Range(0.0, 1.0, low_open=True),
    "positions.rope_scaling_factor": Range(1.0),
    # data
    "data.task_min_length": AT_LEAST_1, "data.task_max_length": AT_LEAST_1,
    # optimizer
    "optimizer.lr": POSITIVE, "optimizer.min_lr": Range(0.0), "optimizer.weight_decay": Range(0.0),
    "optimizer.adam_beta1": BELOW_1, "optimizer.adam_beta2": BELOW_1, "optimizer.adam_eps": POSITIVE,
    "optimizer.clip_grad": Range(0.0),  # 0 = no clipping (Megatron's rule)
    "optimizer.lr_warmup_iters": AT_LEAST_0, "optimizer.max_consecutive_skipped_iters": AT_LEAST_1,
    # schedule
    "schedule.micro_batch_size": AT_LEAST_1, "schedule.global_batch_size": AT_LEAST_1,
    "schedule.train_iters": AT_LEAST_1, "schedule.train_tokens": AT_LEAST_1,
    "schedule.tokens_per_parameter": POSITIVE,
    # checkpoint
    "checkpoint.save_interval": AT_LEAST_1, "checkpoint.keep_last": AT_LEAST_1,
    # logging
    "logging.log_interval": AT_LEAST_1, "logging.eval_interval": AT_LEAST_1, "logging.eval_iters": AT_LEAST_1,
    "logging.peak_tflops": POSITIVE, "logging.straggler_interval": AT_LEAST_0,
    "logging.straggler_threshold": Range(1.0, low_open=True),
}


def check_range(key: str, value: object) -> None:
    """ValueError naming `key`, its range and the value when a numeric value lies outside it (None, bools,
    strings and lists are the type check's business)."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    bounds = RANGES.get(key)
    if bounds is not None and not bounds.holds(value):
        raise ValueError(f"{key} must be {bounds} (got {value})")
