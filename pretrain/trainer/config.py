"""Training configuration: YAML mapped onto dataclasses, `--set key=value` overrides, validation.
(The sections data, optimizer, schedule, checkpoint, logging and their own checks: config_sections; text to
values, and the per-field type checks: config_values.)

Sections mirror Megatron's argument names where Megatron has one (model.num_layers,
parallel.tensor_model_parallel_size, schedule.global_batch_size, checkpoint.save, ...).
Everything is validated here, before any process group exists.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from megatron_ext.model_config import ModelConfig
from megatron_ext.parallel import ParallelConfig
from pretrain.table import model_preset
from pretrain.trainer.config_no_ops import check_no_ops
from pretrain.trainer.config_ranges import check_range
from pretrain.trainer.config_sections import (CheckpointConfig, DataConfig, LoggingConfig, OptimizerSettings,
                                              ScheduleConfig, WandbConfig)
from pretrain.trainer.config_values import coerce, parse_value, read_yaml, shown
from pretrain.trainer.data_paths import check_data_path, parse_blend
from pretrain.trainer.task_data import task_source
from megatron_ext.positions import PositionConfig

REQUEUE_EXIT_CODE = 75  # EX_TEMPFAIL: "saved on SIGTERM/SIGUSR1, requeue me"
# (the hang watchdog's exit code, 76, lives in pretrain/trainer/watchdog.py: HANG_EXIT_CODE)
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


@dataclass
class TrainConfig:
    """A whole training run."""

    name: str = "run"
    seed: int = 1234
    preset: str | None = None  # model preset the model section starts from
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    positions: PositionConfig = field(default_factory=PositionConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    @property
    def run_dir(self) -> Path:
        """Directory holding checkpoints, the resolved config and TensorBoard events."""
        return Path(self.checkpoint.save or f"runs/{self.name}")

    def train_iters(self) -> int:
        """Iterations: explicit, or from a token budget (explicit or Chinchilla ratio)."""
        if self.schedule.train_iters is not None:
            return self.schedule.train_iters
        return max(1, self.train_tokens() // self.tokens_per_iteration())  # Table 16 rounds down

    def train_tokens(self) -> int:
        """Token budget of the run."""
        if self.schedule.train_iters is not None:
            return self.schedule.train_iters * self.tokens_per_iteration()
        if self.schedule.train_tokens is not None:
            return self.schedule.train_tokens
        return int(self.schedule.tokens_per_parameter * self.model.non_embedding_parameters())

    def tokens_per_iteration(self) -> int:
        """Tokens consumed by one optimizer step."""
        return self.schedule.global_batch_size * self.model.seq_length

    def num_microbatches(self, data_parallel_size: int) -> int:
        """Gradient-accumulation steps per optimizer step on each DP rank."""
        return self.schedule.global_batch_size // (self.schedule.micro_batch_size * data_parallel_size)

    def validate(self, world_size: int) -> None:
        """Every check that needs the whole config; raises ValueError naming the fields and the fix."""
        self.parallel.check_model(self.model)
        dp = self.parallel.data_parallel_size(world_size)
        auto = self.schedule.micro_batch_size == "auto"  # resolved before training (pretrain.trainer.micro_batch)
        micro = dp if auto else self.schedule.micro_batch_size * dp
        if self.schedule.global_batch_size % micro:
            raise ValueError(f"schedule.global_batch_size ({self.schedule.global_batch_size}) must be divisible "
                             + (f"by DP ({dp})" if auto else
                                f"by schedule.micro_batch_size × DP ({self.schedule.micro_batch_size} × {dp})"))
        self.positions.validate_for(self.model.seq_length)
        check_no_ops(self.model)  # a layer frequency that selects no layer (noted values: the train command)
        self.model.check_positions(self.positions.strategy, self.positions.rope_scaling, self.positions.layer_mode)
        if self.model.rope_kernel == "triton":  # a GPU (or Triton's interpreter) is needed: refused before start
            from megatron_ext.rope_attention import chosen_rope_kernel

            chosen_rope_kernel("triton", rope=self.model.position_embedding_type == "rope")
        pp = self.parallel.pipeline_model_parallel_size
        if self.parallel.virtual_pipeline_model_parallel_size is not None and not auto \
                and self.num_microbatches(dp) % pp:
            # Megatron's interleaved schedule runs microbatches in groups of PP per virtual stage.
            raise ValueError(f"parallel.virtual_pipeline_model_parallel_size needs microbatches per step "
                             f"({self.num_microbatches(dp)} = global_batch_size / (micro_batch_size × DP)) "
                             f"to be a multiple of parallel.pipeline_model_parallel_size ({pp})")
        if self.optimizer.lr_warmup_iters >= self.train_iters():
            raise ValueError(f"optimizer.lr_warmup_iters ({self.optimizer.lr_warmup_iters}) must be smaller than the "
                             f"run's {self.train_iters()} iterations; lower it, e.g. --set optimizer.lr_warmup_iters=0")
        if self.data.document_masking:
            _check_document_masking(self)
        if self.data.task:
            task_source().check(self.data, self.model)
        elif not self.data.synthetic:
            if not self.data.data_path:
                raise ValueError("data.data_path is missing: pass the data_prep --data-prefix "
                                 "(e.g. --set data.data_path=data/owt) or set data.synthetic=true")
            check_data_path(self.data.data_path)
            self._check_vocab_covers_data()
        if self.logging.wandb is not None and self.logging.wandb.enabled:
            from pretrain.trainer.tracking import check_wandb

            check_wandb(self.logging.wandb)


    def _check_vocab_covers_data(self) -> None:
        """model.vocab_size must hold every id of the data's tokenizer (else an IndexError deep in torch, or
        silent training on out-of-range ids once the TP padding covers them)."""
        from data_prep.manifest import load_manifest

        for _, prefix in parse_blend(self.data.data_path):
            try:
                tokens = load_manifest(prefix).vocab_size
            except (OSError, ValueError, KeyError, TypeError):
                continue  # an unreadable manifest is reported, with its fix, where the data is opened
            if tokens > self.model.vocab_size:
                raise ValueError(f"model.vocab_size is {self.model.vocab_size} but the data {prefix!r} was tokenized "
                                 f"with a {tokens}-token tokenizer; pass --set model.vocab_size={tokens} (or more), "
                                 "or data built with the model's tokenizer")


def _check_document_masking(config: "TrainConfig") -> None:
    """ValueError naming the fix when data.document_masking cannot run with this model or layout."""
    if config.parallel.context_parallel_size > 1:
        raise ValueError("data.document_masking=true with parallel.context_parallel_size > 1 is not supported "
                         "(the block-diagonal mask is not sliced per CP rank); set context_parallel_size=1")
    if config.positions.strategy == "pose":
        raise ValueError("positions.strategy=pose with data.document_masking=true is not supported (PoSE skips "
                         "positions across one window, not per document); set data.document_masking=false")
    if config.model.transformer_impl != "local":
        raise ValueError("data.document_masking=true needs model.transformer_impl=local (the [b, 1, s, s] mask path; "
                         "the trainer does not pack THD sequences for Transformer Engine)")


SECTIONS = {"model": ModelConfig, "parallel": ParallelConfig, "positions": PositionConfig,
            "data": DataConfig, "optimizer": OptimizerSettings, "schedule": ScheduleConfig,
            "checkpoint": CheckpointConfig, "logging": LoggingConfig}
TOP_LEVEL = ("name", "seed", "preset")
NESTED = {("logging", "wandb")}  # fields that are sections of their own


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply `section.field=value` strings to a raw config dict (copy); each value is read by its field's type
    (config_values.parse_value), so `@data/owt` or `#x` is a string, never YAML syntax or null."""
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected key=value, e.g. --set optimizer.lr=3e-4")
        key, value = item.split("=", 1)
        key = key.strip()
        parts = key.split(".")
        if len(parts) == 1 and parts[0] in TOP_LEVEL:
            raw[parts[0]] = parse_value(key, _annotation(TrainConfig, key, parts[0]), value)
        elif len(parts) == 2 and parts[0] in SECTIONS:
            raw.setdefault(parts[0], {})[parts[1]] = parse_value(key, _annotation(SECTIONS[parts[0]], key, parts[1]),
                                                                 value)
        elif len(parts) == 3 and tuple(parts[:2]) in NESTED:  # logging.wandb.project=...
            section = raw.setdefault(parts[0], {})
            nested = section.get(parts[1])
            parsed = parse_value(key, _annotation(WandbConfig, key, parts[2]), value)
            section[parts[1]] = {**(nested if isinstance(nested, dict) else {}), parts[2]: parsed}
        else:
            raise ValueError(f"--set {key}: unknown key; use one of {', '.join(TOP_LEVEL)} or "
                             f"<section>.<field> with section in {', '.join(SECTIONS)} "
                             f"(nested: logging.wandb.<field>)")
    return raw


def _annotation(cls: type, key: str, name: str) -> Any:
    """The annotation of field `name` of `cls`; an unknown field is named with the allowed ones."""
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    if name not in fields:
        raise ValueError(f"--set {key}: unknown field {name!r}; allowed: {', '.join(sorted(fields))}")
    return fields[name]


def from_dict(raw: dict) -> TrainConfig:
    """Build (and field-validate) a TrainConfig from a nested dict."""
    unknown = set(raw) - set(SECTIONS) - set(TOP_LEVEL)
    if unknown:
        raise ValueError(f"unknown config section(s) {sorted(unknown)}; allowed: "
                         f"{', '.join(TOP_LEVEL + tuple(SECTIONS))}")
    kwargs: dict[str, Any] = {k: raw[k] for k in TOP_LEVEL if k in raw}
    if "seed" in kwargs and (isinstance(kwargs["seed"], bool) or not isinstance(kwargs["seed"], int)):
        raise ValueError(f"seed must be an integer, got {shown(kwargs['seed'])}")
    for key in ("name", "preset"):
        if kwargs.get(key) is not None and not isinstance(kwargs[key], str):
            raise ValueError(f"{key} must be a string, got {shown(kwargs[key])}")
    check_range("seed", kwargs.get("seed"))
    for section, cls in SECTIONS.items():
        if not isinstance(raw.get(section) or {}, dict):
            raise ValueError(f"config section '{section}' must be a mapping of <field>: <value> lines, got "
                             f"{shown(raw[section])}")
        values = dict(raw.get(section) or {})
        names = {f.name for f in dataclasses.fields(cls)}
        bad = set(values) - names
        if bad:
            raise ValueError(f"unknown field(s) {sorted(bad)} in section '{section}'; "
                             f"allowed: {', '.join(sorted(names))}")
        values = {name: coerce(section, f, values[name]) for name, f in
                  ((f.name, f) for f in dataclasses.fields(cls)) if name in values}
        for name, value in values.items():
            check_range(f"{section}.{name}", value)
        if section == "data" and isinstance(values.get("data_path"), list):
            parse_blend(values["data_path"])  # a flat [weight, prefix, ...] list, refused in one line otherwise
        if section == "model" and raw.get("preset"):
            kwargs[section] = model_preset(raw["preset"], **values)
        else:
            kwargs[section] = cls(**values)
    config = TrainConfig(**kwargs)
    check_run_dir_name(config)
    return config


NAME_MAX = 255  # bytes of one path component on Linux filesystems


def check_run_dir_name(config: TrainConfig) -> None:
    """ValueError (one line, the fix) when a component of the run directory is longer than a filesystem allows."""
    for part in config.run_dir.parts:
        size = len(os.fsencode(part))
        if size > NAME_MAX:
            field_name = "checkpoint.save" if config.checkpoint.save else "name"
            raise ValueError(f"{field_name} makes a run directory name of {size} bytes ({shown(part)}); a filesystem "
                             f"allows {NAME_MAX}: shorten {field_name}")


def load(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML config (or start from defaults) and apply overrides."""
    raw: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            candidates = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
            raise ValueError(f"config file {path} not found; shipped configs are in {CONFIG_DIR}: "
                             f"{', '.join(candidates[:8])}{' ...' if len(candidates) > 8 else ''}")
        raw = read_yaml(path)
        if raw is None:  # an empty file (or only comments) would silently train the built-in defaults
            raise ValueError(f"config file {path} is empty; write its sections (model:, schedule:, ...) or drop "
                             "--config to start from the defaults")
        if not isinstance(raw, dict):
            raise ValueError(f"config file {path} must hold a mapping of sections (model:, schedule:, ...), "
                             f"got {type(raw).__name__}")
    return from_dict(apply_overrides(raw, overrides or []))


def plain_fields(section: Any) -> dict:
    """A config dataclass as a YAML/JSON-safe dict (tuples become lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(section).items()}


def to_dict(config: TrainConfig) -> dict:
    """Plain nested dict (the resolved config; YAML-safe)."""
    out: dict[str, Any] = {k: getattr(config, k) for k in TOP_LEVEL}
    for section in SECTIONS:
        out[section] = plain_fields(getattr(config, section))
    out["preset"] = None  # the model section is fully resolved already
    return out


def dump(config: TrainConfig) -> str:
    """The resolved config as YAML."""
    return yaml.safe_dump(to_dict(config), sort_keys=False)
