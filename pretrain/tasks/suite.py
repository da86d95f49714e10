"""`python -m pretrain reproduce --suite tasks`: every position method on the papers' algorithmic tasks.

For each (task, method, seed): one Megatron-Core training run on fresh task examples with
lengths U{a..N} (same seed ⇒ same examples in the same order and the same initial weights for
every method), then greedy exact match at every length 1..4N on held-out examples with the
method's inference-time positions, then a report in the papers' shape (accuracy-vs-length plot
per task, a table of mean seen / unseen accuracy ± SE, results.json). Finished runs and
evaluations are reused on a rerun.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pretrain.tasks.generators import TASKS, VOCAB_SIZE
from pretrain.tasks.source import sequence_tokens


@dataclass(frozen=True)
class Method:
    """A row of the suite: model.* and positions.* fields (max_position resolved per task)."""

    model: dict
    positions: dict
    # positions.max_position: "eval" = the longest evaluation input (RPE must cover it; RFS on ALiBi
    # uses "the maximum input length of the dataset", RFS App. B.4); "rfs" = 8 × the training window.
    max_position: str | None = None


METHODS: dict[str, Method] = {
    "rope": Method({}, {"strategy": "none"}),
    "posaug": Method({}, {"strategy": "posaug", "alpha_min": 0.125, "alpha_max": 8.0, "alpha_distribution": "uniform"}),
    "rfs": Method({}, {"strategy": "rfs"}, max_position="rfs"),
    "rpe": Method({}, {"strategy": "rpe"}, max_position="eval"),
    "warp": Method({}, {"strategy": "warp", "p_head": 0.15, "p_tail": 0.15, "tail_function": "sqrt"}),
    "nope": Method({"position_embedding_type": "none"}, {"strategy": "none"}),
    "alibi": Method({"position_embedding_type": "alibi"}, {"strategy": "none"}),
    "rfs_alibi": Method({"position_embedding_type": "alibi"}, {"strategy": "rfs"}, max_position="eval"),
}


@dataclass(frozen=True)
class SuitePreset:
    """Tasks with their training range (a, N), model, budget and evaluation of one suite."""

    tasks: dict[str, tuple[int, int]]
    model: dict
    train_iters: int
    global_batch_size: int
    lr: float
    eval_factor: int = 4  # evaluate lengths 1 .. eval_factor · N
    eval_count: int = 200  # examples per length
    methods: tuple[str, ...] = tuple(METHODS)

    def eval_max(self, task: str) -> int:
        """Longest evaluated length of `task`."""
        return self.eval_factor * self.tasks[task][1]


# d 128, 4 heads (the copy-task probe's model, SwiGLU/RMSNorm as everywhere here).
_PROBE_MODEL = dict(num_layers=3, hidden_size=128, ffn_hidden_size=352, num_attention_heads=4,
                    num_query_groups=4)
PRESETS: dict[str, SuitePreset] = {
    # Default, ≤ 30 min on 2 cores: copy and reverse (the two tasks the RoPE baseline must learn
    # to ≥ 95 % on seen lengths), N = 10, every method, one seed.
    "cpu-small": SuitePreset(tasks={"copy": (1, 10), "reverse": (1, 10)}, model=_PROBE_MODEL,
                             train_iters=1000, global_batch_size=64, lr=1e-3),
    # Every task and method, the papers' ranges: copy/reverse N = 20 (warping paper), the others 8.
    "cpu-long": SuitePreset(tasks={"copy": (1, 20), "copy2": (1, 20), "reverse": (1, 20), "addition": (2, 8),
                                   "sort": (1, 8), "summation": (1, 8), "duplicate": (1, 20),
                                   "missing_duplicate": (1, 20)},
                            model=_PROBE_MODEL, train_iters=3000, global_batch_size=64, lr=1e-3),
    # Seconds-scale smoke run of the whole pipeline (CI); numbers are not meaningful.
    "cpu-tiny": SuitePreset(tasks={"copy": (1, 3)}, model=dict(num_layers=1, hidden_size=32, ffn_hidden_size=64,
                                                              num_attention_heads=2, num_query_groups=2),
                            train_iters=3, global_batch_size=8, lr=1e-3, eval_count=4),
}


def _log(message: str) -> None:
    print(f"[tasks] {message}", flush=True)


def run_config(preset: SuitePreset, task: str, method: str, seed: int, run_dir: Path) -> dict:
    """The raw TrainConfig dict of one run."""
    lo, hi = preset.tasks[task]
    window = sequence_tokens(task, hi)
    row = METHODS[method]
    positions = dict(row.positions)
    if row.max_position == "eval":
        positions["max_position"] = sequence_tokens(task, preset.eval_max(task))
    elif row.max_position == "rfs":
        positions["max_position"] = 8 * window
    iters = preset.train_iters
    return {
        "name": run_dir.name, "seed": seed, "preset": "cpu-small",
        "model": {**preset.model, "seq_length": window, "vocab_size": VOCAB_SIZE, **row.model},
        "positions": positions,
        "data": {"task": task, "task_min_length": lo, "task_max_length": hi},
        "schedule": {"train_iters": iters, "global_batch_size": preset.global_batch_size,
                     "micro_batch_size": preset.global_batch_size},
        "optimizer": {"lr": preset.lr, "min_lr": preset.lr / 10, "lr_warmup_iters": max(1, iters // 20),
                      "weight_decay": 0.1, "clip_grad": 1.0},
        "checkpoint": {"save": str(run_dir), "save_interval": iters, "keep_last": 1},
        "logging": {"log_interval": max(1, iters // 4), "eval_interval": iters, "eval_iters": 1},
    }


def train_runs(out: Path, preset: SuitePreset, seeds: list[int]) -> dict[tuple[str, str, int], Path]:
    """Train every (task, method, seed) not finished yet, one fresh process each; returns the run dirs."""
    from pretrain.trainer import config as config_module
    from pretrain.trainer.checkpoint import latest_iteration

    runs = {(t, m, s): out / "runs" / f"{t}_{m}_s{s}" for s in seeds for t in preset.tasks for m in preset.methods}
    todo = [key for key, run_dir in runs.items() if latest_iteration(run_dir) != preset.train_iters]
    started = time.time()
    for done, key in enumerate(todo):
        task, method, seed = key
        eta = f"; ETA {(time.time() - started) / done * (len(todo) - done) / 60:.1f} min" if done else ""
        _log(f"[{done + 1}/{len(todo)} to train, {len(runs)} runs] {task} / {method} / seed {seed}{eta}")
        config_file = out / "configs" / f"{runs[key].name}.yaml"
        config_file.parent.mkdir(parents=True, exist_ok=True)
        config = config_module.from_dict(run_config(preset, task, method, seed, runs[key]))
        config_file.write_text(config_module.dump(config))
        proc = subprocess.run([sys.executable, "-m", "pretrain", "train", "--config", str(config_file)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"training {runs[key].name} failed (exit {proc.returncode}, config {config_file}):\n"
                               f"{proc.stdout[-3000:]}")
        last = [line for line in proc.stdout.splitlines() if line.startswith("step ") and "/" in line.split()[1]]
        if last:
            _log(f"    {last[-1]}")
    return runs


def evaluate_run(run_dir: Path, preset: SuitePreset, task: str, seed: int) -> dict:
    """Exact match per length 1..eval_max with the method's inference positions; a JSON-able record."""
    import torch

    from megatron_ext.positions import build_sampler
    from pretrain.tasks.evaluate import accuracy_by_length, summarize
    from pretrain.trainer.inference_model import load_for_inference

    model, config = load_for_inference(run_dir)
    sampler = build_sampler(config.positions, seed=config.seed, train_seq_len=config.model.seq_length,
                            num_layers=config.model.num_layers, rotary_dim=config.model.rotary_dim,
                            rotary_base=config.model.rotary_base, total_steps=preset.train_iters)

    def logits(tokens: torch.Tensor, positions) -> torch.Tensor:
        return model(tokens, positions, None)[..., :VOCAB_SIZE]

    lengths = range(TASKS[task].min_length, preset.eval_max(task) + 1)
    results = accuracy_by_length(logits, task, lengths, preset.eval_count, seed=10_000 + seed,
                                 positions_for=sampler.evaluation, train_lengths=preset.tasks[task])
    return {"task": task, "seed": seed, "train_lengths": list(preset.tasks[task]),
            "lengths": [r.to_dict() for r in results], "summary": summarize(results)}


def evaluate_runs(out: Path, preset: SuitePreset, runs: dict[tuple[str, str, int], Path]) -> list[dict]:
    """Evaluate every run once (cached as eval/<run>.json)."""
    records = []
    for index, ((task, method, seed), run_dir) in enumerate(runs.items(), 1):
        path = out / "eval" / f"{run_dir.name}.json"
        if not path.is_file():
            started = time.time()
            record = {"method": method, **evaluate_run(run_dir, preset, task, seed)}
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record))
            seen, unseen = record["summary"]["seen"], record["summary"]["unseen"]
            _log(f"[eval {index}/{len(runs)}] {task} / {method}: seen {seen['accuracy']:.3f}, unseen "
                 f"{unseen['accuracy'] if unseen else float('nan'):.3f} ({time.time() - started:.0f} s)")
        records.append(json.loads(path.read_text()))
    return records


def run_suite(out: Path, preset: SuitePreset, seeds: list[int], preset_name: str) -> Path:
    """Train, evaluate, report; returns the report path."""
    from pretrain.tasks.report import write_report

    started = time.time()
    out.mkdir(parents=True, exist_ok=True)
    runs = train_runs(out, preset, seeds)
    records = evaluate_runs(out, preset, runs)
    report = write_report(out, preset_name, preset, records, seeds, time.time() - started)
    _log(f"report: {report}")
    return report


def main(argv: list[str]) -> int:
    """`python -m pretrain reproduce --suite tasks [--preset ...] [--tasks ...] [--methods ...]`."""
    import argparse
    import dataclasses

    parser = argparse.ArgumentParser(prog="python -m pretrain reproduce --suite tasks", description=__doc__.split("\n")[0])
    parser.add_argument("--output", default="tasks_out", help="working and report directory (resumable)")
    parser.add_argument("--preset", default="cpu-small", choices=sorted(PRESETS))
    parser.add_argument("--seeds", type=int, default=1, help="number of seeds (42, 137, 2024, then 1, 2, ...)")
    parser.add_argument("--tasks", nargs="+", default=None, help="subset of the preset's tasks")
    parser.add_argument("--methods", nargs="+", default=None, help=f"subset of {list(METHODS)}")
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    unknown = [t for t in args.tasks or [] if t not in preset.tasks] + [m for m in args.methods or [] if m not in METHODS]
    if unknown:
        print(f"error: {unknown} not in preset {args.preset}: tasks {list(preset.tasks)}, methods {list(METHODS)}",
              file=sys.stderr)
        return 2
    if args.tasks:
        preset = dataclasses.replace(preset, tasks={t: preset.tasks[t] for t in args.tasks})
    if args.methods:
        preset = dataclasses.replace(preset, methods=tuple(args.methods))
    seeds = ([42, 137, 2024] + list(range(1, 100)))[: args.seeds]
    run_suite(Path(args.output), preset, seeds, args.preset)
    return 0
