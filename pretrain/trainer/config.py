"""Training configuration: YAML mapped onto dataclasses, `--set key=value` overrides, validation.
(Text to values, and the per-field type checks: config_values.)

Sections mirror Megatron's argument names where Megatron has one (model.num_layers,
parallel.tensor_model_parallel_size, schedule.global_batch_size, checkpoint.save, ...).
Everything is validated here, before any process group exists.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from megatron_ext.model import ModelConfig, ParallelConfig
from pretrain.table import model_preset
from pretrain.trainer.config_ranges import check_range
from pretrain.trainer.config_values import coerce, parse_value, read_yaml
from pretrain.trainer.data import check_data_path, parse_blend, task_source
from megatron_ext.positions import PositionConfig

REQUEUE_EXIT_CODE = 75  # EX_TEMPFAIL: "saved on SIGTERM/SIGUSR1, requeue me"
# (the hang watchdog's exit code, 76, lives in pretrain/trainer/watchdog.py: HANG_EXIT_CODE)
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


@dataclass
class DataConfig:
    """Where tokens come from: a data_prep data prefix (its manifest), or synthetic tokens."""

    # data_prep --data-prefix (shards and manifest are found from it), or a weighted blend of
    # several, as Megatron's --data-path: [w1, prefix1, w2, prefix2, ...]
    data_path: str | list | None = None
    synthetic: bool = False  # random tokens (tests, smoke runs): no data_path needed
    # An algorithmic task of the registered task source (pretrain.tasks: copy, reverse, sort, ...): fresh examples every step,
    # lengths ~ U{task_min_length..task_max_length}, loss on the answer tokens only.
    task: str | None = None
    task_min_length: int = 1
    task_max_length: int = 20
    # Packed documents kept apart (Megatron's reset_attention_mask + reset_position_ids): attention
    # masked at every EOD, positions restarting per document for every position strategy but pose
    # (refused), SSMax's n and the NoPE-layer temperature counted per document.
    # Training only: validation and evaluation see plain windows, so their losses compare across runs.
    document_masking: bool = False
    eod_mask_loss: bool = False  # Megatron's name: no loss on EOD inputs (training)
    # Read and stack the next step's microbatches in a background thread while this step trains (pinned
    # memory with CUDA); false reads each microbatch when the schedule asks for it. Same order either way.
    prefetch: bool = True


@dataclass
class OptimizerSettings:
    """AdamW + warmup/cosine schedule; names follow Megatron's arguments (PosAug Table 16)."""

    lr: float = 6e-4
    min_lr: float = 6e-5
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    lr_warmup_iters: int = 0
    lr_decay_style: str = "cosine"
    # An iteration whose loss or gradients hold NaN/inf applies no update (Megatron's "skipped
    # iteration"); this many in a row stop the run before anything non-finite is saved.
    max_consecutive_skipped_iters: int = 3
    # torch's fused AdamW (one kernel for every param) instead of its foreach one: null = on CUDA (where
    # Megatron, without TE/Apex, builds torch's AdamW), false = foreach everywhere, true = fused on CPU too
    adam_fused: bool | None = None

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ValueError(f"optimizer.lr must be > 0 and 0 <= optimizer.min_lr <= lr "
                             f"(got lr={self.lr}, min_lr={self.min_lr})")
        if self.lr_decay_style not in ("cosine", "linear", "constant"):
            raise ValueError(f"optimizer.lr_decay_style must be cosine, linear or constant "
                             f"(got {self.lr_decay_style!r})")
        if self.lr_warmup_iters < 0:
            raise ValueError(f"optimizer.lr_warmup_iters must be >= 0 (got {self.lr_warmup_iters})")
        if self.max_consecutive_skipped_iters < 1:
            raise ValueError(f"optimizer.max_consecutive_skipped_iters must be >= 1 (1 stops at the first skipped "
                             f"iteration; got {self.max_consecutive_skipped_iters})")


@dataclass
class ScheduleConfig:
    """Batch sizes and run length. train_iters wins over train_tokens over tokens_per_parameter."""

    # a number, or auto: the largest that `pretrain plan` says fits this rank's memory (pretrain.trainer.micro_batch)
    micro_batch_size: int | str = 4
    global_batch_size: int = 128
    train_iters: int | None = None
    train_tokens: int | None = None
    tokens_per_parameter: float = 20.0  # Chinchilla

    def __post_init__(self) -> None:
        if self.micro_batch_size != "auto" and (not isinstance(self.micro_batch_size, int)
                                                or self.micro_batch_size < 1):
            raise ValueError(f"schedule.micro_batch_size must be a number >= 1 or auto (got {self.micro_batch_size!r})")
        if self.global_batch_size < 1:
            raise ValueError("schedule.micro_batch_size and schedule.global_batch_size must be >= 1")
        if self.train_iters is not None and self.train_iters < 1:
            raise ValueError(f"schedule.train_iters must be >= 1 (got {self.train_iters})")


@dataclass
class CheckpointConfig:
    """Megatron distributed checkpoints: where, how often, how many to keep."""

    save: str | None = None  # run directory; None = runs/<name>
    save_interval: int = 1000
    keep_last: int = 3
    load: str | None = None  # initialise from this checkpoint dir when `save` has none yet
    # `save` holds only a damaged/abandoned run (no intact checkpoint): delete it and start over
    # instead of refusing. Intact checkpoints are never deleted: a run with them always resumes.
    overwrite: bool = False

    def __post_init__(self) -> None:
        if self.save_interval < 1 or self.keep_last < 1:
            raise ValueError("checkpoint.save_interval and checkpoint.keep_last must be >= 1")


WANDB_MODES = ("online", "offline", "disabled")


@dataclass
class WandbConfig:
    """Weights & Biases tracking beside TensorBoard (`logging.wandb`; needs the `wandb` extra)."""

    project: str = "pretrain"
    entity: str | None = None  # W&B user or team; None = the API key's default entity
    # None = online when a W&B API key is found (WANDB_API_KEY or ~/.netrc), else offline (`wandb sync` later)
    mode: str | None = None

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in WANDB_MODES:
            raise ValueError(f"logging.wandb.mode must be one of {', '.join(WANDB_MODES)} or null for "
                             f"online-when-logged-in (got {self.mode!r})")
        for name in ("project", "entity"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()
                                      or any(c in value for c in "/\\#?%:")):
                raise ValueError(f"logging.wandb.{name} must be a non-empty name without / \\ # ? % : "
                                 f"(got {value!r})")

    @property
    def enabled(self) -> bool:
        """False for mode `disabled`: nothing is written and wandb is not needed."""
        return self.mode != "disabled"


@dataclass
class LoggingConfig:
    """Console/TensorBoard/W&B cadence and validation."""

    log_interval: int = 10
    eval_interval: int = 500
    eval_iters: int = 10
    tensorboard_dir: str | None = None  # None = <save>/tensorboard
    peak_tflops: float | None = None  # per device, for MFU; None = looked up for known GPUs
    wandb: WandbConfig | None = None  # {project, entity, mode}; None = no W&B
    # Every this many steps the ranks gather their step times (stragglers.py); 0 = never.
    straggler_interval: int = 100
    straggler_threshold: float = 1.5  # report the slowest rank when its time is this many times the median's

    def __post_init__(self) -> None:
        if self.straggler_interval < 0 or self.straggler_threshold <= 1:
            raise ValueError(f"logging.straggler_interval must be >= 0 (0 = off) and logging.straggler_threshold > 1 "
                             f"(got {self.straggler_interval} and {self.straggler_threshold})")
        if isinstance(self.wandb, dict):  # from YAML / --set
            self.wandb = _subsection("logging.wandb", WandbConfig, self.wandb)
        elif self.wandb is not None and not isinstance(self.wandb, WandbConfig):
            raise ValueError(f"logging.wandb must be a mapping such as {{project: my-project, mode: offline}} "
                             f"(got {self.wandb!r})")


def _subsection(name: str, cls: type, values: dict) -> Any:
    """A nested config dataclass from a dict, naming unknown fields."""
    allowed = {f.name for f in dataclasses.fields(cls)}
    bad = set(values) - allowed
    if bad:
        raise ValueError(f"unknown field(s) {sorted(bad)} in {name}; allowed: {', '.join(sorted(allowed))}")
    return cls(**values)


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
        raise ValueError(f"seed must be an integer, got {kwargs['seed']!r}")
    for key in ("name", "preset"):
        if kwargs.get(key) is not None and not isinstance(kwargs[key], str):
            raise ValueError(f"{key} must be a string, got {kwargs[key]!r}")
    check_range("seed", kwargs.get("seed"))
    for section, cls in SECTIONS.items():
        if not isinstance(raw.get(section) or {}, dict):
            raise ValueError(f"config section '{section}' must be a mapping of <field>: <value> lines, got "
                             f"{raw[section]!r}")
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
        if section == "model" and raw.get("preset"):
            kwargs[section] = model_preset(raw["preset"], **values)
        else:
            kwargs[section] = cls(**values)
    return TrainConfig(**kwargs)


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
