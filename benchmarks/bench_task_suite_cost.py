"""CPU cost of a task-suite preset, measured on a subset and extrapolated (labelled as such).

    .venv/bin/python benchmarks/bench_task_suite_cost.py --preset cpu-papers --short 20 --long 80

Per task, with the RoPE baseline: two trainings of `--short` and `--long` steps (each its own
process, 1 thread, as the suite runs them); their CPU-time difference / (long − short) is the
CPU per step without start-up, the short run's CPU minus short × per-step is the start-up. Then
the preset's full evaluation (every length, every example) of the long run's checkpoint: its
cost does not depend on accuracy (one teacher-forced forward per batch). Extrapolation:
methods × (start-up + train_iters × per-step + evaluation), optionally scaled per method by
CPU ratios to RoPE measured elsewhere (`--method-ratios results.json` of a finished suite run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pretrain.table import current_name  # noqa: E402
from pretrain.tasks.suite import PRESETS, evaluate_run, run_config  # noqa: E402
from pretrain.trainer import config as config_module  # noqa: E402


def train_cpu(preset, task: str, steps: int, work: Path) -> float:
    """CPU seconds of one RoPE training of `steps` steps in its own 1-thread process."""
    run_dir = work / f"{task}_{steps}"
    raw = run_config(dataclasses.replace(preset, train_iters=steps), task, "baseline", 42, run_dir)
    config_file = work / f"{task}_{steps}.yaml"
    config_file.write_text(config_module.dump(config_module.from_dict(raw)))
    proc = subprocess.Popen([sys.executable, "-m", "pretrain", "train", "--config", str(config_file)],
                            cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"training {task} failed: {proc.stderr.read().decode()[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def method_ratios(path: Path | None) -> dict[str, float]:
    """Per method: training CPU / RoPE's training CPU in a finished suite run (1.0 each without one)."""
    if path is None:
        return {}
    results = json.loads(path.read_text())
    timing = results["timing"]["per_run_train_cpu_s"]
    ratios: dict[str, list[float]] = {}
    for seed in results["seeds"]:
        for task in results["train_lengths"]:
            # results written before the rename call the baseline "rope" (pretrain.table.FORMER_NAMES)
            base = timing.get(f"{task}_baseline_s{seed}") or timing.get(f"{task}_rope_s{seed}")
            for method in results["methods"]:
                cpu = timing.get(f"{task}_{method}_s{seed}")
                if base and cpu:
                    ratios.setdefault(current_name(method), []).append(cpu / base)
    return {m: sum(v) / len(v) for m, v in ratios.items()}


def main() -> None:
    """Measure per task, extrapolate to the preset, print a Markdown table."""
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="cpu-papers", choices=sorted(PRESETS))
    parser.add_argument("--short", type=int, default=20)
    parser.add_argument("--long", type=int, default=80)
    parser.add_argument("--tasks", nargs="+", default=None)
    parser.add_argument("--method-ratios", type=Path, default=None, help="results.json of a finished suite run")
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    ratios = method_ratios(args.method_ratios)
    scale = sum(ratios.get(m, 1.0) for m in preset.methods)
    torch.set_num_threads(1)
    print(f"load average at start: {os.getloadavg()[0]:.1f}; method CPU ratios vs baseline: "
          f"{ {m: round(r, 2) for m, r in ratios.items()} or 'none (all 1.0)'}", flush=True)
    rows, total = [], 0.0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for task in args.tasks or list(preset.tasks):
            short, long = train_cpu(preset, task, args.short, work), train_cpu(preset, task, args.long, work)
            per_step = (long - short) / (args.long - args.short)
            startup = short - args.short * per_step
            before, started = resource.getrusage(resource.RUSAGE_SELF), time.time()
            evaluate_run(work / f"{task}_{args.long}", preset, task, 42)
            after = resource.getrusage(resource.RUSAGE_SELF)
            evaluation = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            cost = scale * (startup + preset.train_iters * per_step) + len(preset.methods) * evaluation
            total += cost
            rows.append(f"| {task} | {1000 * per_step:.0f} | {startup:.0f} | {evaluation:.0f} | {cost / 60:.0f} |")
            print(rows[-1], f"(eval wall {time.time() - started:.0f} s, load {os.getloadavg()[0]:.1f})", flush=True)
    print(f"\n{args.preset}: {preset.train_iters} steps × {len(preset.methods)} methods per task, 1 seed\n")
    print("| task | measured CPU ms/step | start-up CPU s | evaluation CPU s | extrapolated CPU min (all methods) |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\nextrapolated total: {total / 60:.0f} CPU-min ≈ {total / 3600 / (os.cpu_count() or 1):.1f} h wall on a "
          f"quiet {os.cpu_count()}-core machine (estimate)")


if __name__ == "__main__":
    main()
