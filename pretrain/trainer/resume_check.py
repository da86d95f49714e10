"""Before a run resumes: the model it trains must be the model its checkpoints hold.

Checked on every rank before the process groups exist and before anything in the run directory is written
(lock, config.yaml, status.json): a changed model field would otherwise end in Megatron's
CheckpointingException at load time, after config.yaml had been overwritten with the new config. Only the
model section is compared; train_iters, the schedule, the parallel layout and logging may change on resume.
"""

from __future__ import annotations

import json
from pathlib import Path

from pretrain.trainer.config import TrainConfig, to_dict
from pretrain.trainer.run_dir import STATE, CheckpointError, checkpoints

# Model fields that may change on resume: the same weights and the same math, computed another way, or
# settings that shape no checkpointed tensor (dropout rates; the init std, unused once weights are loaded); bf16,
# whose checkpoints hold the same fp32 values either way (pretrain/trainer/precision_resume.py).
MAY_CHANGE = frozenset({"recompute_granularity", "recompute_method", "recompute_num_layers", "core_attention",
                        "use_cpu_initialization", "hidden_dropout", "attention_dropout", "init_method_std", "bf16",
                        "compile", "rope_kernel"})


def recorded_model(run_dir: Path) -> tuple[Path, dict] | None:
    """(checkpoint, its recorded model section) of the newest checkpoint whose train_state.json reads, or None."""
    for _, path in checkpoints(run_dir):
        try:
            model = json.loads((path / STATE).read_text())["config"]["model"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # damaged: plan_resume says so and skips it
        if isinstance(model, dict):
            return path, model
    return None


def check_model_unchanged(config: TrainConfig) -> None:
    """Raise CheckpointError naming every model field that differs from the run's checkpoints, with the fix."""
    found = recorded_model(config.run_dir)
    if found is None:
        return
    path, saved = found
    now = to_dict(config)["model"]
    changed = [name for name, value in now.items() if name in saved and name not in MAY_CHANGE
               and saved[name] != value]
    if not changed:
        return
    fields = "; ".join(f"model.{n}: {saved[n]!r} in the checkpoint, {now[n]!r} now" for n in changed)
    old_values = " ".join(f"model.{n}={json.dumps(saved[n])}" for n in changed)
    raise CheckpointError(f"run directory {config.run_dir} holds checkpoints of another model ({path.name}): "
                          f"{fields}; resume it with the old value{'s' if len(changed) > 1 else ''} (--set "
                          f"{old_values}), or train the changed model in a new run directory (--set "
                          f"checkpoint.save=<new run dir>); nothing in {config.run_dir} was changed")
