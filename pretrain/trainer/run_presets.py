"""`train CONFIG --preset NAME`: a shipped config shrunk to a CPU run in one flag (the one table of them).

A shipped YAML is written for GPUs at the paper's scale (Transformer Engine, bf16, w = 2048, 50,257 tokens,
500 warm-up steps, 500M tokens). A preset replaces exactly those with what one CPU
process runs: local layers, fp32, the preset's model size, window, batch, learning
rate and token budget (warm-up 5 % of the steps, as `reproduce` trains), the method's window-relative fields at
the new window (pretrain/table.py), and the vocabulary of the data's tokenizer (its data_prep manifest; the
preset's own for synthetic data). The sizes are `reproduce --preset`'s (pretrain/experiments/presets.py;
tests/trainer/test_run_presets.py keeps them equal), where a cliff was measured at that budget. Every
`--set` given with `--preset` wins over it. docs/config.md lists this table (generated).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RUN_PRESETS", "RunPreset", "preset_overrides"]


@dataclass(frozen=True)
class RunPreset:
    """One CPU shrink of a shipped config."""

    size: str  # the model size (pretrain/table.py SIZES)
    window: int
    train_tokens: int
    global_batch_size: int
    micro_batch_size: int
    lr: float
    vocab_size: int  # synthetic data only: otherwise the data's tokenizer decides
    what: str

    @property
    def train_iters(self) -> int:
        """Optimizer steps at this budget."""
        return self.train_tokens // (self.global_batch_size * self.window)


RUN_PRESETS = {
    "cpu-tiny": RunPreset("tiny", 32, 8_192, 16, 16, 3e-3, 512,
                          "seconds: a smoke run of the pipeline; its losses mean nothing"),
    "cpu-small": RunPreset("cpu-small", 64, 1_638_400, 32, 32, 3e-3, 4096,
                           "~3.5 min per model on 2 cores; reproduce's baseline cliff at 8w: 0.336 nats, PosAug's "
                           "-0.029 (benchmarks/results/reproduce_cpu-small_seed42.md)"),
    "cpu-long": RunPreset("cpu-small", 128, 6_553_600, 32, 32, 3e-3, 4096,
                          "~11 min per model on 2 cores; reproduce's baseline cliff at 8w: 1.107 nats, PosAug's "
                          "0.002 (benchmarks/results/reproduce_cpu-long_seed42.md)"),
}

# What every preset sets besides its sizes, each with why a CPU process needs it.
CPU_FIELDS = {
    "model.transformer_impl=local": "Transformer Engine needs a GPU",
    "model.bf16=false": "fp32, as reproduce trained the presets' measured cliffs",
    "model.fp8=null": "FP8 runs only through Transformer Engine",
    "schedule.train_iters=null": "the preset's token budget decides the steps",
}


def _data_vocab(data_path) -> int | None:
    """The largest tokenizer vocabulary of the data prefixes' manifests (None when none has one)."""
    from pathlib import Path

    from data_prep.manifest import load_manifest, manifest_path
    from pretrain.trainer.data import parse_blend

    sizes = [load_manifest(prefix).vocab_size for _, prefix in parse_blend(data_path)
             if Path(manifest_path(prefix)).is_file()]
    return max(sizes) if sizes else None


def _method_fields(name: str | None, window: int) -> list[str]:
    """The shipped method's window-relative fields at `window` (from the config's name <size>_<method>)."""
    from pretrain.table import METHODS, method_overrides

    method = (name or "").split("_", 1)[-1]
    return method_overrides(method, window) if method in METHODS else []


def preset_overrides(preset: str, config_path: str | None, overrides: list[str]) -> list[str]:
    """The `--set` list of `--preset`, followed by the user's own (which win)."""
    from pretrain.trainer import config as config_module

    if preset not in RUN_PRESETS:
        raise ValueError(f"unknown --preset {preset!r}; choose one of {', '.join(RUN_PRESETS)}")
    p = RUN_PRESETS[preset]
    given = config_module.load(config_path, overrides)
    vocab = None if given.data.synthetic or not given.data.data_path else _data_vocab(given.data.data_path)
    iters = p.train_iters
    sets = [*CPU_FIELDS, f"preset={p.size}", f"model.seq_length={p.window}",
            f"model.vocab_size={vocab or p.vocab_size}", f"schedule.train_tokens={p.train_tokens}",
            f"schedule.global_batch_size={p.global_batch_size}", f"schedule.micro_batch_size={p.micro_batch_size}",
            f"optimizer.lr={p.lr}", f"optimizer.min_lr={p.lr / 10}", f"optimizer.lr_warmup_iters={max(1, iters // 20)}",
            f"checkpoint.save_interval={max(1, iters // 4)}", f"logging.log_interval={max(1, iters // 8)}",
            f"logging.eval_interval={iters}", *_method_fields(given.name, p.window)]
    return [*sets, *overrides]


def preset_table() -> str:
    """docs/config.md's table of the presets (generated)."""
    rows = ["| `--preset` | model size | window | tokens (steps) | batch | lr | vocabulary | what it is |",
            "|---|---|---|---|---|---|---|---|"]
    for name, p in RUN_PRESETS.items():
        rows.append(f"| `{name}` | `{p.size}` | {p.window} | {p.train_tokens:,} ({p.train_iters}) | "
                    f"{p.global_batch_size} | {p.lr:g} | the data's tokenizer (synthetic: {p.vocab_size}) | {p.what} |")
    rows += ["", "Every preset also sets: " + "; ".join(f"`{k}` ({why})" for k, why in CPU_FIELDS.items())
             + "; warm-up 5 % of the steps, min_lr = lr / 10, a save every quarter of the run, and the method's "
             "window-relative fields (positions.max_position, NoPE-interleave floors) at the new window."]
    return "\n".join(rows)
