"""`python -m pretrain reproduce --suite tasks`: every position method on the papers' algorithmic tasks.

For each (task, method, seed): one Megatron-Core training run on fresh task examples with
lengths U{a..N} (same seed ⇒ same examples in the same order and the same initial weights for
every method), then greedy exact match at every length 1..4N on held-out examples with the
method's inference-time positions, then a report in the papers' shape (accuracy-vs-length plot
per task, a table of mean seen / unseen accuracy ± SE, PosAug against each row paired per held-out
example, results.json). Finished runs and evaluations are reused on a rerun.

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
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from pretrain.faults import write_text_atomic
from pretrain.tasks.generators import TASKS, VOCAB_SIZE
from pretrain.tasks.source import sequence_tokens
from pretrain.trainer.run_pool import load_average, machine, train_in_processes


from pretrain.tasks.presets import METHODS, PRESETS, SuitePreset  # noqa: F401 (re-exported)


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
    budget = preset.budget(task)
    iters = budget["train_iters"]
    return {
        "name": run_dir.name, "seed": seed, "preset": "cpu-small",
        "model": {**budget["model"], "seq_length": window, "vocab_size": VOCAB_SIZE, **row.model_fields(window)},
        "positions": positions,
        "data": {"task": task, "task_min_length": lo, "task_max_length": hi},
        "schedule": {"train_iters": iters, "global_batch_size": budget["global_batch_size"],
                     "micro_batch_size": budget["global_batch_size"]},
        "optimizer": {"lr": budget["lr"], "min_lr": budget["lr"] / 10, "lr_warmup_iters": max(1, iters // 20),
                      "weight_decay": 0.1, "clip_grad": 1.0},
        "checkpoint": {"save": str(run_dir), "save_interval": iters, "keep_last": 1},
        "logging": {"log_interval": max(1, iters // 4), "eval_interval": iters, "eval_iters": 1},
    }


def train_runs(out: Path, preset: SuitePreset, seeds: list[int], jobs: int = 1) -> dict[tuple[str, str, int], Path]:
    """Train every (task, method, seed) not finished yet, `jobs` processes at a time (trainer.run_pool); returns
    the run dirs."""
    from pretrain.trainer import config as config_module
    from pretrain.trainer.checkpoint import latest_iteration

    runs = {(t, m, s): out / "runs" / f"{t}_{m}_s{s}" for s in seeds for t in preset.tasks for m in preset.methods}
    keys = {run_dir.name: key for key, run_dir in runs.items()}
    todo = [run_dir.name for key, run_dir in runs.items() if latest_iteration(run_dir) != preset.iters(key[0])]
    (out / "configs").mkdir(parents=True, exist_ok=True)

    def write_config(name: str) -> Path:
        task, method, seed = keys[name]
        config_file = out / "configs" / f"{name}.yaml"
        config = config_module.from_dict(run_config(preset, task, method, seed, runs[keys[name]]))
        write_text_atomic(config_file, config_module.dump(config), what="run config")
        return config_file

    def on_start(name: str, queued: int, eta: str) -> None:
        task, method, seed = keys[name]
        done = len(todo) - queued
        _log(f"[{done}/{len(todo)} to train, {len(runs)} runs, load {load_average()}] {task} / {method} / "
             f"seed {seed}{eta}")

    def on_end(name: str, timing: dict) -> None:
        last = [line for line in (out / "logs" / f"{name}.log").read_text().splitlines()
                if line.startswith("step ") and "/" in line.split()[1]]
        _log(f"    {name}: {last[-1] if last else 'done'} | {timing['wall_s']:.0f} s wall, "
             f"{timing['cpu_s']:.0f} s CPU")

    train_in_processes(todo, jobs=jobs, write_config=write_config, log_dir=out / "logs", timing_dir=out / "timing",
                       on_start=on_start, on_end=on_end)
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
                            rotary_base=config.model.rotary_base, total_steps=preset.iters(task))

    def logits(tokens: torch.Tensor, positions) -> torch.Tensor:
        return model(tokens, positions, None)[..., :VOCAB_SIZE]

    lengths = preset.eval_lengths(task, TASKS[task].min_length)
    results = accuracy_by_length(logits, task, lengths, preset.eval_count, seed=10_000 + seed,
                                 positions_for=sampler.evaluation, train_lengths=preset.tasks[task])
    return {"task": task, "seed": seed, "train_lengths": list(preset.tasks[task]),
            "lengths": [r.to_dict() for r in results], "summary": summarize(results)}


def _evaluate_timed(run_dir: Path, preset: SuitePreset, task: str, method: str, seed: int,
                    threads: int | None) -> dict:
    """evaluate_run with `threads` torch threads (None: this process's own), plus its wall and CPU seconds."""
    import resource

    from pretrain.console import quiet_known_warnings

    quiet_known_warnings()  # a spawned worker starts without the filters `python -m pretrain` installed
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    started, before = time.time(), resource.getrusage(resource.RUSAGE_SELF)
    record = {"method": method, **evaluate_run(run_dir, preset, task, seed)}
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {**record, "eval_timing": {"wall_s": time.time() - started, "cpu_s": cpu}}


def _without_examples(path: Path) -> bool:
    """Was this cached evaluation written before per-example scores were stored (pretrain.tasks.versus pairs them)?"""
    record = json.loads(path.read_text())
    return not all(x.get("example_tokens") for x in record["lengths"])


def _evaluations(todo: dict[tuple[str, str, int], Path], preset: SuitePreset,
                 jobs: int) -> Iterator[tuple[tuple[str, str, int], dict]]:
    """(key, record) of each run in `todo`, evaluated here with one job (a worker process would pay ~5 CPU-s of
    imports for nothing), else in `jobs` spawned workers (a fresh interpreter each, no forked torch thread pools)
    as they finish."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    if jobs == 1:
        for key, run_dir in todo.items():
            yield key, _evaluate_timed(run_dir, preset, *key, threads=None)
        return
    threads = max(1, (os.cpu_count() or 1) // jobs)
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_evaluate_timed, run_dir, preset, *key, threads=threads): key
                   for key, run_dir in todo.items()}
        for future in as_completed(futures):
            yield futures[future], future.result()


def evaluate_runs(out: Path, preset: SuitePreset, runs: dict[tuple[str, str, int], Path],
                  jobs: int = 1, refresh: bool = True) -> list[dict]:
    """Evaluate every run once (cached as eval/<run>.json), `jobs` worker processes at a time.

    refresh: also re-evaluate cached evaluations without per-example scores whose checkpoint is still there; a
    re-evaluation that changes a number keeps the former file as eval/<run>.before-examples.json and says so.
    """
    from pretrain.tasks.evaluate import without_example_scores
    from pretrain.trainer.checkpoint import latest_iteration

    cached = {key: out / "eval" / f"{run_dir.name}.json" for key, run_dir in runs.items()}
    todo = {key: run_dir for key, run_dir in runs.items() if not cached[key].is_file()}
    stale = {key: run_dir for key, run_dir in runs.items() if refresh and key not in todo
             and _without_examples(cached[key]) and latest_iteration(run_dir) is not None}
    if stale:
        _log(f"re-evaluating {len(stale)} run(s) evaluated before per-example scores were stored, so that methods "
             "pair example by example")
    former = {key: json.loads(cached[key].read_text()) for key in stale}
    todo.update(stale)
    if todo:
        (out / "eval").mkdir(parents=True, exist_ok=True)
        for index, (key, record) in enumerate(_evaluations(todo, preset, jobs), 1):
            task, method, _ = key
            if key in former and former[key]["lengths"] != without_example_scores(record["lengths"]):
                write_text_atomic(cached[key].with_suffix(".before-examples.json"), json.dumps(former[key]),
                                  what="the former evaluation")
                _log(f"    {runs[key].name}: re-evaluation changed a count; the former evaluation is kept as "
                     f"{cached[key].with_suffix('.before-examples.json')}")
            write_text_atomic(cached[key], json.dumps(record), what="the run's evaluation")
            seen, unseen = record["summary"]["seen"], record["summary"]["unseen"]
            _log(f"[eval {index}/{len(todo)}, load {load_average()}] {task} / {method}: seen {seen['accuracy']:.3f}, "
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


INVOCATIONS = "invocations.json"  # under timing/: one record per training invocation on the output directory


def invocation_id() -> str:
    """A key no other invocation on the same output directory shares (start times repeat within a second)."""
    return uuid.uuid4().hex


def record_invocation(out: Path, record: dict) -> list[dict]:
    """Add or update (same "invocation" id) this invocation's record in timing/invocations.json; returns all records.

    A resumable suite may be split across invocations, so the report sums their wall times instead of
    showing only the last one's. The key is an id, not the start time: an invocation with nothing to do ends
    within the second, so the next one can start in the second it started.
    """
    path = out / "timing" / INVOCATIONS
    records = json.loads(path.read_text()) if path.is_file() else []
    records = [r for r in records if r.get("invocation") != record["invocation"]] + [record]
    write_text_atomic(path, json.dumps(records, indent=1), what="the suite's invocation timings")
    return records


def _timed_runs(out: Path) -> set[str]:
    return {p.name for p in (out / "timing").glob("*.json") if p.name != INVOCATIONS}


def run_suite(out: Path, preset: SuitePreset, seeds: list[int], preset_name: str, jobs: int = 1,
              report_only: bool = False) -> Path:
    """Train, evaluate, report, one (seed, task) block at a time, rewriting the report after each block
    so an interrupted run leaves a report of everything finished; returns the report path.

    report_only: no training or evaluation, a report of the evaluations already on disk.
    """
    import dataclasses

    from pretrain.tasks.report import write_report

    started, load_start, invocation = time.time(), load_average(), invocation_id()
    out.mkdir(parents=True, exist_ok=True)
    timed_before = _timed_runs(out)
    invocations = json.loads(path.read_text()) if (path := out / "timing" / INVOCATIONS).is_file() else []
    runs: dict[tuple[str, str, int], Path] = {}
    records: list[dict] = []
    report = out / "report.md"
    for seed in seeds:
        for task in preset.tasks:
            block = dataclasses.replace(preset, tasks={task: preset.tasks[task]})
            if report_only:
                done = {(task, m, seed): out / "runs" / f"{task}_{m}_s{seed}" for m in preset.methods}
                done = {k: d for k, d in done.items() if (out / "eval" / f"{d.name}.json").is_file()}
                records += evaluate_runs(out, block, done, jobs, refresh=False)
            else:
                done = train_runs(out, block, [seed], jobs)
                records += evaluate_runs(out, block, done, jobs)
            runs.update(done)
            if not records:
                continue
            timing = {**timings(out, runs, records), "wall_s": time.time() - started, "jobs": jobs,
                      "load_start": load_start, "load_end": load_average(), "report_only": report_only}
            if not report_only:
                invocations = record_invocation(out, {
                    "invocation": invocation, "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
                    "wall_s": timing["wall_s"], "jobs": jobs, "load_start": load_start, "load_end": timing["load_end"],
                    "runs_trained": len(_timed_runs(out) - timed_before), "seeds": seeds, "tasks": list(preset.tasks),
                    "machine": machine()})
            timing["invocations"] = invocations
            report = write_report(out, preset_name, preset, records, sorted({r["seed"] for r in records}), timing)
            if not report_only:
                _log(f"report of {len(records)} of {len(preset.tasks) * len(preset.methods) * len(seeds)} runs: "
                     f"{report}")
    if not records:
        raise FileNotFoundError(f"no evaluated runs under {out / 'eval'}; run without --report-only first")
    _log(f"report: {report}")
    return report


def scaled(preset: SuitePreset, train_iters: int | None, eval_count: int | None,
           eval_stride: int | None) -> SuitePreset:
    """The preset with the command line's scale-downs applied, each listed among its deviations."""
    import dataclasses

    changes, notes = {}, []
    if train_iters is not None:
        changes.update(train_iters=train_iters,
                       budgets={t: {**b, "train_iters": train_iters} for t, b in preset.budgets.items()})
        notes.append(f"--train-iters {train_iters} (every task; the preset's budgets were " +
                     ", ".join(f"{t} {preset.iters(t)}" for t in preset.tasks) + ")")
    if eval_count is not None:
        changes["eval_count"] = eval_count
        notes.append(f"--eval-count {eval_count} (preset {preset.eval_count})")
    if eval_stride is not None:
        changes["eval_stride"] = eval_stride
        notes.append(f"--eval-stride {eval_stride}: every {eval_stride}-th unseen length (preset {preset.eval_stride})")
    if not changes:
        return preset
    return dataclasses.replace(preset, **changes,
                               deviations=preset.deviations + tuple(f"Scaled down on the command line: {n}."
                                                                    for n in notes))


def _merge(args, argv: list[str]) -> int:
    """--merge: refuse the flags that would select or scale runs (the parts fixed those), then merge."""
    from pretrain.tasks.merge import merge_reports

    ignored = [flag for flag in ("--preset", "--seeds", "--num-seeds", "--tasks", "--methods", "--report-only",
                                 "--train-iters", "--eval-count", "--eval-stride")
               if any(a == flag or a.startswith(flag + "=") for a in argv)]
    if ignored:
        print(f"error: --merge takes preset, seeds, tasks and methods from its results.json files; drop "
              f"{' '.join(ignored)}", file=sys.stderr)
        return 2
    try:
        report = merge_reports(Path(args.output), [Path(p) for p in args.merge])
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    _log(f"report: {report}")
    return 0


def main(argv: list[str]) -> int:
    """`python -m pretrain reproduce --suite tasks [--preset ...] [--tasks ...] [--methods ...]`."""
    import dataclasses

    from pretrain.cli import seeds_of
    from pretrain.table import former_name_hint
    from pretrain.tasks.arguments import tasks_parser

    args = tasks_parser().parse_args(argv)
    if args.merge:
        return _merge(args, argv)
    preset = PRESETS[args.preset]
    unknown_methods = [m for m in args.methods or [] if m not in METHODS]
    unknown = [t for t in args.tasks or [] if t not in preset.tasks] + unknown_methods
    if unknown:
        print(f"error: {unknown} not in preset {args.preset}: tasks {list(preset.tasks)}, methods {list(METHODS)}"
              f"{former_name_hint(unknown_methods)}", file=sys.stderr)
        return 2
    if args.tasks:
        preset = dataclasses.replace(preset, tasks={t: preset.tasks[t] for t in args.tasks})
    if args.methods:
        preset = dataclasses.replace(preset, methods=tuple(args.methods))
    for flag in ("jobs", "train_iters", "eval_count", "eval_stride"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            print(f"error: --{flag.replace('_', '-')} {getattr(args, flag)} must be >= 1", file=sys.stderr)
            return 2
    preset = scaled(preset, args.train_iters, args.eval_count, args.eval_stride)
    try:
        seeds = seeds_of(args)
        run_suite(Path(args.output), preset, seeds, args.preset, args.jobs, args.report_only)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
