"""The sections of a training config below the model, parallel and positions ones (megatron_ext): data,
optimizer, schedule, checkpoint and logging (with logging.wandb), each a dataclass whose field names follow Megatron's
arguments and whose `__post_init__` checks what the section alone can tell. The whole run (`TrainConfig`), the checks
that need several sections, and YAML in and out: config.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


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
