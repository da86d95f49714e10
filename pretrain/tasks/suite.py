"""`python -m pretrain reproduce --suite tasks`: every position method on the papers' algorithmic tasks.

For each (task, method, seed): one Megatron-Core training run on fresh task examples with
lengths U{a..N} (same seed ⇒ same examples in the same order and the same initial weights for
every method), then greedy exact match at every length 1..4N on held-out examples with the
method's inference-time positions, then a report in the papers' shape (accuracy-vs-length plot
per task, a table of mean seen / unseen accuracy ± SE, results.json). Finished runs and
evaluations are reused on a rerun.

Training positions follow each example's own length, as the papers draw them: a task sample
carries position_length (its input count) and the trainer passes it to
PositionSampler.training(lengths=), so at per_sample granularity a length-n example trains on n
sorted RFS positions in [0, L), n sorted distinct RPE integers of [0, L), or warp's tail
n·f(j / n). RFS evaluates at L·(2i − 1) / (2·max(n_tr, T)) with n_tr = the training window, the
longest training example's input count. The remaining deviation (model size and budget) is in
the report.
"""

from __future__ import annotations

import json
import os
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
    # per_sample: the papers draw one sorted position row per example, not one per microbatch.
    "rfs": Method({}, {"strategy": "rfs", "granularity": "per_sample"}, max_position="rfs"),
    "rpe": Method({}, {"strategy": "rpe", "granularity": "per_sample"}, max_position="eval"),
    "warp": Method({}, {"strategy": "warp", "p_head": 0.15, "p_tail": 0.15, "tail_function": "sqrt"}),
    "nope": Method({"position_embedding_type": "none"}, {"strategy": "none"}),
    "alibi": Method({"position_embedding_type": "alibi"}, {"strategy": "none"}),
    "rfs_alibi": Method({"position_embedding_type": "alibi"}, {"strategy": "rfs", "granularity": "per_sample"},
                        max_position="eval"),
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
    # Default, ≤ 30 min on 2 cores: copy and reverse (the tasks the RoPE baseline must learn to
    # ≥ 95 % on seen lengths), N = 10, all 8 methods, one seed: 16 runs. Measured 2026-11-23
    # (benchmarks/README.md): RoPE 100 % seen on both at 1,000 steps (train loss 0.02 by step 500,
    # 0.0004 at 1,000), 0 % unseen; every method ≥ 99.7 % seen. One run ≈ 105–145 s CPU at 1 thread
    # (~0.11 s/step + ~8 s start-up), evaluation ≈ 9 s CPU per run: 35 CPU-min in all ≈ 17.5 min on
    # 2 quiet cores (estimate from CPU time; 30.5 min wall measured under load 3–20). More tasks or
    # 1,500+ steps would not fit: N = 20 (cpu-papers) doubles the per-step cost.
    "cpu-small": SuitePreset(tasks={"copy": (1, 10), "reverse": (1, 10)}, model=_PROBE_MODEL,
                             train_iters=1000, global_batch_size=64, lr=1e-3),
    # Every task and every method at a budget that runs in one sitting (benchmarks/README.md has its
    # measured wall and CPU time): the copy-like tasks at cpu-small's N = 10, addition and summation
    # at the warping paper's N = 8, sort at N = 5 (its window is ~6 tokens per unit of length, so
    # N = 8 would triple sort's per-step and evaluation cost); 600 steps (cpu-small's RoPE copy loss
    # was 0.02 by step 500), 200 examples per length. 64 runs.
    "cpu-long": SuitePreset(tasks={"copy": (1, 10), "copy2": (1, 10), "reverse": (1, 10), "addition": (2, 8),
                                   "sort": (1, 5), "summation": (1, 8), "duplicate": (1, 10),
                                   "missing_duplicate": (1, 10)},
                            model=_PROBE_MODEL, train_iters=600, global_batch_size=64, lr=1e-3),
    # The papers' ranges (copy/reverse N = 20 as the warping paper, the others 8), 3,000 steps. Not run
    # end to end: ≈ 840 CPU-min ≈ 7 h on 2 quiet cores, extrapolated from 60-step measurements per task
    # (benchmarks/bench_task_suite_cost.py, benchmarks/README.md).
    "cpu-papers": SuitePreset(tasks={"copy": (1, 20), "copy2": (1, 20), "reverse": (1, 20), "addition": (2, 8),
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


def _load() -> str:
    """The 1-minute load average (other jobs slow the wall clock, never the CPU time)."""
    return f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "?"


def _start(config_file: Path, log_file: Path, threads: int) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    with log_file.open("w") as log:
        return subprocess.Popen([sys.executable, "-m", "pretrain", "train", "--config", str(config_file)],
                                stdout=log, stderr=subprocess.STDOUT, env=env)


def _reap(proc: subprocess.Popen) -> tuple[int, float] | None:
    """(exit code, CPU seconds of the child) once it has ended, else None."""
    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    if pid == 0:
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def train_runs(out: Path, preset: SuitePreset, seeds: list[int], jobs: int = 1) -> dict[tuple[str, str, int], Path]:
    """Train every (task, method, seed) not finished yet, `jobs` processes at a time; returns the run dirs.

    Each run is its own process with cores // jobs threads: these models are so small that two
    1-thread runs side by side beat one 2-thread run, and OpenMP threads that wait for a core
    on a busy machine spin (wall and CPU time grow several-fold), single threads do not.
    Per-run wall and CPU seconds go to timing/<run>.json for the report.
    """
    from pretrain.trainer import config as config_module
    from pretrain.trainer.checkpoint import latest_iteration

    runs = {(t, m, s): out / "runs" / f"{t}_{m}_s{s}" for s in seeds for t in preset.tasks for m in preset.methods}
    todo = [key for key, run_dir in runs.items() if latest_iteration(run_dir) != preset.train_iters]
    threads = max(1, (os.cpu_count() or 1) // jobs)
    for folder in ("configs", "logs", "timing"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    finished, run_walls = 0, []
    running: dict[tuple[str, str, int], tuple[subprocess.Popen, float]] = {}
    while todo or running:
        while todo and len(running) < jobs:
            key = todo.pop(0)
            task, method, seed = key
            done = finished + len(running)
            # Runs in flight count whole: a slight overestimate, never the 2x of elapsed / finished.
            mean_wall = sum(run_walls) / len(run_walls) if run_walls else 0.0
            eta = f"; ETA {mean_wall * (len(todo) + 1 + len(running)) / jobs / 60:.1f} min" if run_walls else ""
            _log(f"[{done + 1}/{done + 1 + len(todo)} to train, {len(runs)} runs, load {_load()}] "
                 f"{task} / {method} / seed {seed}{eta}")
            config_file = out / "configs" / f"{runs[key].name}.yaml"
            config = config_module.from_dict(run_config(preset, task, method, seed, runs[key]))
            config_file.write_text(config_module.dump(config))
            running[key] = (_start(config_file, out / "logs" / f"{runs[key].name}.log", threads), time.time())
        time.sleep(0.5)
        for key, (proc, begun) in list(running.items()):
            ended = _reap(proc)
            if ended is None:
                continue
            del running[key]
            finished += 1
            code, cpu = ended
            log_file = out / "logs" / f"{runs[key].name}.log"
            if code != 0:
                for other, _ in running.values():
                    other.kill()
                    other.wait()
                raise RuntimeError(f"training {runs[key].name} failed (exit {code}, config "
                                   f"{out / 'configs' / (runs[key].name + '.yaml')}):\n{log_file.read_text()[-3000:]}")
            run_walls.append(time.time() - begun)
            timing = {"wall_s": time.time() - begun, "cpu_s": cpu, "threads": threads, "jobs": jobs,
                      "load_at_end": _load()}
            (out / "timing" / f"{runs[key].name}.json").write_text(json.dumps(timing))
            last = [line for line in log_file.read_text().splitlines()
                    if line.startswith("step ") and "/" in line.split()[1]]
            _log(f"    {runs[key].name}: {last[-1] if last else 'done'} | {timing['wall_s']:.0f} s wall, "
                 f"{cpu:.0f} s CPU")
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


def _evaluate_timed(run_dir: Path, preset: SuitePreset, task: str, method: str, seed: int,
                    threads: int) -> dict:
    """evaluate_run in a worker with `threads` torch threads, plus its wall and CPU seconds."""
    import resource

    import torch

    torch.set_num_threads(threads)
    started, before = time.time(), resource.getrusage(resource.RUSAGE_SELF)
    record = {"method": method, **evaluate_run(run_dir, preset, task, seed)}
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {**record, "eval_timing": {"wall_s": time.time() - started, "cpu_s": cpu}}


def evaluate_runs(out: Path, preset: SuitePreset, runs: dict[tuple[str, str, int], Path],
                  jobs: int = 1) -> list[dict]:
    """Evaluate every run once (cached as eval/<run>.json), `jobs` worker processes at a time."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    todo = {key: run_dir for key, run_dir in runs.items() if not (out / "eval" / f"{run_dir.name}.json").is_file()}
    if todo:
        (out / "eval").mkdir(parents=True, exist_ok=True)
        threads = max(1, (os.cpu_count() or 1) // jobs)
        # spawn: a fresh interpreter per worker, no forked torch thread pools.
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(_evaluate_timed, run_dir, preset, key[0], key[1], key[2], threads): key
                       for key, run_dir in todo.items()}
            for index, future in enumerate(as_completed(futures), 1):
                task, method, seed = futures[future]
                record = future.result()
                (out / "eval" / f"{runs[futures[future]].name}.json").write_text(json.dumps(record))
                seen, unseen = record["summary"]["seen"], record["summary"]["unseen"]
                _log(f"[eval {index}/{len(todo)}, load {_load()}] {task} / {method}: seen {seen['accuracy']:.3f}, "
                     f"unseen {unseen['accuracy'] if unseen else float('nan'):.3f} "
                     f"({record['eval_timing']['wall_s']:.0f} s wall, {record['eval_timing']['cpu_s']:.0f} s CPU)")
    return [json.loads((out / "eval" / f"{run_dir.name}.json").read_text()) for run_dir in runs.values()]


def timings(out: Path, runs: dict[tuple[str, str, int], Path], records: list[dict]) -> dict:
    """Summed CPU seconds of training and evaluation (this invocation's and earlier ones')."""
    train = [json.loads(path.read_text()) for run_dir in runs.values()
             if (path := out / "timing" / f"{run_dir.name}.json").is_file()]
    evals = [r["eval_timing"] for r in records if "eval_timing" in r]
    return {"train_cpu_s": sum(t["cpu_s"] for t in train), "train_runs_timed": len(train),
            "eval_cpu_s": sum(t["cpu_s"] for t in evals), "eval_runs_timed": len(evals), "runs": len(runs),
            "cores": os.cpu_count(), "per_run_train_cpu_s": {run_dir.name: json.loads(path.read_text())["cpu_s"]
                                                               for run_dir in runs.values()
                                                               if (path := out / "timing" / f"{run_dir.name}.json").is_file()}}


def run_suite(out: Path, preset: SuitePreset, seeds: list[int], preset_name: str, jobs: int = 1) -> Path:
    """Train, evaluate, report; returns the report path."""
    from pretrain.tasks.report import write_report

    started, load_start = time.time(), _load()
    out.mkdir(parents=True, exist_ok=True)
    runs = train_runs(out, preset, seeds, jobs)
    records = evaluate_runs(out, preset, runs, jobs)
    timing = {**timings(out, runs, records), "wall_s": time.time() - started, "jobs": jobs,
              "load_start": load_start, "load_end": _load()}
    report = write_report(out, preset_name, preset, records, seeds, timing)
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
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="runs trained / evaluated side by side, each with cores/jobs threads (default: cores)")
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
    if args.jobs < 1:
        print(f"error: --jobs {args.jobs} must be >= 1", file=sys.stderr)
        return 2
    seeds = ([42, 137, 2024] + list(range(1, 100)))[: args.seeds]
    run_suite(Path(args.output), preset, seeds, args.preset, args.jobs)
    return 0
