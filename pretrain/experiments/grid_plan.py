"""The grid of `reproduce --slurm`: its spec (sizes x methods x seeds), its plan, and what of it is done.

pretrain.experiments.slurm_grid is the command line; grid_submit submits, grid_status reports and runs the
jobs' stages. State lives in files (run directories, evaluation records, OUT/grid.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from pretrain.faults import write_text_atomic
from pretrain.experiments.presets import INFERENCE, PRESETS, Preset
from pretrain.table import EXTRAPOLATION, PAPER_VOCAB, PAPER_WINDOW, SIZES

ROOT = Path(__file__).resolve().parents[2]
GRID_FILE = "grid.json"
PAPER = "paper"
# The paper's Table 2 grid: every Table 1 size x the shipped methods, n = 3 seeds, evaluated at 16K
# (8 x w) on 20 spans with G(C) over a 512-token window, plus the baseline under PI / NTK / YaRN (Table 4).
PAPER_SEEDS = (42, 137, 2024)
PAPER_EVAL_LENGTH = EXTRAPOLATION * PAPER_WINDOW
PAPER_SPANS = 20
PAPER_GAIN_WINDOW = 512
# Resources of the jobs that are not training: the launchers' #SBATCH lines cover training.
EVAL_RESOURCES = {"gpu": ["--gpus-per-node=1", "--cpus-per-task=8", "--time=04:00:00"],
                  "cpu": ["--cpus-per-task=1", "--time=60"]}
REPORT_RESOURCES = ["--cpus-per-task=1", "--time=30"]
# CPU presets train on CPU nodes: one task, no GPU (common.sh then switches to the local implementation).
CPU_TRAIN_RESOURCES = ["--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1", "--time=60"]
CPU_LAUNCHER_SIZE = "10m"  # the launcher (1 node x 1 GPU defaults) a CPU preset's runs go through, with CONFIG=
JOB_PREFIX = "grid-"  # of every job name the grid submits
LIVE_STATES = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED")


def _log(message: str) -> None:
    print(f"[grid] {message}", flush=True)


@dataclass(frozen=True)
class Spec:
    """One grid: preset, sizes × methods × seeds, where its data and outputs live, and how to plan it."""

    preset: str
    out: str
    sizes: tuple[str, ...]
    methods: tuple[str, ...]
    seeds: tuple[int, ...]
    data_prefix: str
    gpu: str
    sets: tuple[str, ...] = ()
    corpus: str | None = None
    tokenizer: str | None = None
    sbatch: tuple[str, ...] = ()
    mfu: float | None = None
    nodes: int | None = None  # of every training job (None: the launcher's; CPU presets 1)
    budget: str | None = None  # paper preset: pretrain.plan.budget name (None: the shipped configs' Table 1)

    @property
    def cpu(self) -> bool:
        """True for the reproduce presets (one config per method written by us, their own data); see on_gpu."""
        return self.preset != PAPER

    @property
    def on_gpu(self) -> bool:
        """True when the runs train and evaluate on GPU nodes: the paper grid and GPU presets (gpu-10m)."""
        return not self.cpu or PRESETS[self.preset].gpu

    def launcher(self, size: str, method: str) -> Path:
        """The launcher of (size, method)'s training array: the paper's own; a preset's runs go through the
        launcher of their GPU size (gpu-10m: 10m) or, on CPU nodes, the 10m one, with CONFIG= their config
        (the baseline's launcher for a method without a shipped one: the config says it all)."""
        if not self.cpu:
            return ROOT / "slurm" / f"pretrain_{size}_{method}.sh"
        size = size if self.on_gpu else CPU_LAUNCHER_SIZE
        launcher = ROOT / "slurm" / f"pretrain_{size}_{method}.sh"
        return launcher if launcher.is_file() else ROOT / "slurm" / f"pretrain_{size}_baseline.sh"

    def runs(self) -> list[tuple[str, str, int]]:
        """(size, method, seed) of every run, size-major."""
        return [(size, method, seed) for size in self.sizes for method in self.methods for seed in self.seeds]

    def to_json(self) -> dict:
        """JSON-able form (grid.json)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: dict) -> "Spec":
        """Inverse of to_json."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})


def run_name(size: str, method: str, seed: int) -> str:
    """The run directory's name: the launchers' `<size>_<method>_seed<seed>`."""
    return f"{size}_{method}_seed{seed}"


def parse_run_name(name: str) -> tuple[str, str, int]:
    """Inverse of run_name."""
    match = re.fullmatch(r"(.+?)_(.+)_seed(\d+)", name)
    if not match:
        raise ValueError(f"run {name!r}: expected <size>_<method>_seed<seed>")
    return match.group(1), match.group(2), int(match.group(3))


def size_preset(spec: Spec, size: str) -> Preset:
    """The reproduction Preset of one size of the grid (the report and the evaluation read it)."""
    if spec.cpu:
        return dataclasses.replace(PRESETS[spec.preset], methods=spec.methods)
    row = SIZES[size]
    return Preset(model=size, window=PAPER_WINDOW, vocab_size=PAPER_VOCAB, train_tokens=row.train_tokens,
                  global_batch_size=row.global_batch_size, micro_batch_size=row.micro_batch_size, lr=row.lr,
                  eval_length=PAPER_EVAL_LENGTH, num_spans=PAPER_SPANS,
                  gain_window=PAPER_GAIN_WINDOW, corpus_bytes=0, valid_fraction=0.0, gain_spans=PAPER_SPANS,
                  methods=spec.methods)


def train_config(spec: Spec, size: str, method: str):
    """The TrainConfig every seed of (size, method) trains (the launcher adds seed, name and run dir)."""
    from pretrain.trainer import config as config_module

    if spec.cpu:
        from pretrain.experiments.reproduce import train_config as cpu_config

        base = cpu_config(size_preset(spec, size), method, spec.seeds[0], spec.data_prefix,
                          Path(spec.out) / "runs" / f"{size}_{method}")
        raw = config_module.to_dict(base)
        return config_module.from_dict(config_module.apply_overrides(raw, list(spec.sets)))
    from pretrain.plan.budget import budget_override

    return config_module.load(config_module.CONFIG_DIR / f"{size}_{method}.yaml",
                              [f"data.data_path={spec.data_prefix}", *budget_override(size, spec.budget), *spec.sets])


# ---- the plan ---------------------------------------------------------------------------------------------

def plan_grid(spec: Spec) -> tuple[str, list[str]]:
    """The grid's plan as text (per size × method and in total) and the one-line refusals of runs that do not fit."""
    from pretrain.plan.hardware import CONTEXT_ALLOWANCE_BYTES, GIB
    from pretrain.plan.layout import plan_for
    from pretrain.plan.report import duration, gib, one_line_refusal, parse_slurm_time

    args = argparse.Namespace(nodes=spec.nodes, gpus_per_node=None, dp=None, gpu=spec.gpu, mfu=spec.mfu,
                              allowance_gib=CONTEXT_ALLOWANCE_BYTES / GIB)
    from pretrain.plan.budget import BUDGETS, budget_tokens, gpu_hours_at

    n = len(spec.seeds)
    by_budget = dict.fromkeys(BUDGETS, 0.0)
    width = max(22, *(len(f"{size}_{method}") + 2 for size in spec.sizes for method in spec.methods))
    rows = [f"{'run':<{width}}{'GPUs':>6}{'peak/GPU':>13}{'fits':>6}{'steps':>9}{'wall/run':>13}{'GPU-h/run':>11}"
            f"{'seeds':>7}{'GPU-h':>10}{'jobs/run':>10}"]
    total, longest, serial, refusals, gpu_label = 0.0, 0.0, 0.0, [], spec.gpu
    for size in spec.sizes:
        for method in spec.methods:
            name = f"{size}_{method}"
            try:
                plan = plan_for(train_config(spec, size, method), args)
            except ValueError as error:
                refusals.append(f"{name}: {error}")
                continue
            gpu_label = plan.gpu_label
            if not plan.fits:
                refusals.append(one_line_refusal(plan).replace(plan.name, name, 1))
            total += plan.gpu_hours * n
            if not spec.cpu:
                for budget in BUDGETS:
                    by_budget[budget] += gpu_hours_at(plan, budget_tokens(size, budget)) * n
            longest, serial = max(longest, plan.wall_seconds), serial + plan.wall_seconds * n
            jobs = "-"
            slurm = SIZES[size].slurm
            if slurm is not None and spec.on_gpu:  # requeued jobs a run needs within the launcher's --time
                jobs = str(math.ceil(plan.wall_seconds / max(parse_slurm_time(slurm.time) - slurm.usr1_lead_s, 1)))
            rows.append(f"{name:<{width}}{plan.layout.world:>6}{gib(plan.worst.peak):>13}"
                        f"{'yes' if plan.fits else 'NO':>6}{plan.iterations:>9,}{duration(plan.wall_seconds):>13}"
                        f"{plan.gpu_hours:>11,.1f}{n:>7}"
                        f"{plan.gpu_hours * n:>10,.1f}{jobs:>10}")
    rows.append(f"{'total':<{width}}{'':>65}{len(spec.runs()):>7}{total:>10,.1f}")
    if not spec.cpu:  # both budgets side by side, whichever this grid trains
        rows.append(f"GPU-hours of this grid: {', '.join(f'{b} {h:,.1f}' for b, h in by_budget.items())} "
                    f"(--budget {spec.budget or 'table1'} is what it submits; chinchilla = 20 tokens per parameter)")
    mfu = f"MFU {spec.mfu:.0%}" if spec.mfu else "measured MFU where stored, else the GPU's published one"
    where = ("the launchers' nodes" if spec.on_gpu
             else "CPU nodes (the plan is what the same runs would take on the GPU)")
    text = "\n".join([f"plan: grid `{spec.preset}` on {gpu_label}, {mfu}, runs on {where}", *rows,
                      f"wall clock: {duration(longest)} when every run has its GPUs at once, "
                      f"{duration(serial)} one run at a time"])
    return text, refusals


# ---- state ------------------------------------------------------------------------------------------------

def load_state(out: Path) -> dict:
    """OUT/grid.json: the spec and the jobs submitted so far ({} when none)."""
    path = out / GRID_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except ValueError as error:
        raise ValueError(f"{path} is damaged ({error}): move it away and rerun (finished runs are kept)") from None


def save_state(out: Path, state: dict) -> None:
    """Write OUT/grid.json atomically."""
    write_text_atomic(out / GRID_FILE, json.dumps(state, indent=1), what="grid state",
                      elsewhere="pass an --output on a larger disk", then="rerun the same command")


def eval_labels(method: str) -> list[str]:
    """The evaluation records one run's evaluation job writes (the baseline's also the inference-time rows)."""
    return [method, *(INFERENCE if method == "baseline" else ())]


def eval_path(spec: Spec, size: str, label: str, seed: int) -> Path:
    """Where reproduce.evaluate_runs caches one record (under the size's results directory)."""
    return Path(spec.out) / "results" / size / "eval" / f"{label}_s{seed}.json"


def evaluated(spec: Spec, size: str, method: str, seed: int) -> bool:
    """True when every record of the run exists."""
    preset_inference = size_preset(spec, size).inference
    return all(eval_path(spec, size, label, seed).is_file() for label in eval_labels(method)
               if label == method or label in preset_inference)


def train_finished(spec: Spec, size: str, method: str, seed: int, iters: int | None = None) -> bool:
    """True when the run's newest complete checkpoint is its last iteration."""
    from pretrain.runs import inspect_run

    run_dir = Path(spec.out) / "runs" / run_name(size, method, seed)
    return (run_dir / "config.yaml").is_file() and inspect_run(run_dir).finished


def shards_ready(prefix: str) -> bool:
    """True when data_prep's manifest for `prefix` exists (data_prep verifies its shards itself)."""
    from data_prep.manifest import manifest_path

    return Path(manifest_path(prefix)).is_file()
