"""`reproduce --suite tasks --merge A/results.json B/results.json --output DIR`: one report of stored suites.

A suite too long for one sitting is run a few tasks at a time, each into its own output directory; its working
files (checkpoints, per-example scores) may be gone by the time the last part ends. This joins the parts'
results.json files into one report, as if one invocation had run every task: the tables, the rankings and the
tallies over all tasks come from the code, not from a reader's arithmetic. Nothing is trained or evaluated.

Only parts of one experiment join: the same preset (each task's training range and budget as the preset has them
today) and the same seeds, split either by task (the same methods, no task in two parts) or by method (the same
tasks, no method in two parts: new rows run beside a stored suite). PosAug against each row is paired per held-out
example; a results.json keeps those paired results ("versus_posaug") but not the per-example scores, so the merged
report uses the stored ones, and computes unpaired ones (conservative, and marked so) only for a row PosAug never
ran beside, i.e. one from another method part.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pretrain.table import current_name
from pretrain.tasks.presets import PRESETS

_SUMMED = ("train_cpu_s", "train_runs_timed", "eval_cpu_s", "eval_runs_timed", "runs", "wall_s")


def _load(path: Path) -> dict:
    """One part's results.json; ValueError (one line) when it is not a task suite's."""
    if not path.is_file():
        raise ValueError(f"--merge {path}: no such file; give the results.json of each suite's --output")
    try:
        results = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"--merge {path}: not JSON ({error}); give a task suite's results.json") from None
    missing = [k for k in ("preset", "seeds", "methods", "train_lengths", "budgets", "records", "timing")
               if k not in results]
    if missing:
        raise ValueError(f"--merge {path}: not a task suite's results.json (no {', '.join(missing)})")
    return results


def _check_part(path: Path, results: dict, first: dict) -> None:
    """The part is of the first part's experiment, and its tasks are the preset's as it stands."""
    for key in ("preset", "seeds"):
        if results[key] != first[key]:
            raise ValueError(f"--merge {path}: {key} {results[key]} but the first part has {first[key]}; "
                             "merge only parts of one experiment")
    preset = PRESETS.get(results["preset"])
    if preset is None:
        raise ValueError(f"--merge {path}: preset {results['preset']!r} is not one of {sorted(PRESETS)}")
    for task, lengths in results["train_lengths"].items():
        if task not in preset.tasks:
            raise ValueError(f"--merge {path}: task {task} is not in preset {results['preset']} today")
        now = {"train_lengths": list(preset.tasks[task]), "budget": preset.budget(task)}
        stored = {"train_lengths": lengths, "budget": results["budgets"].get(task)}
        if stored != now:
            raise ValueError(f"--merge {path}: {task} was trained with {stored} but preset {results['preset']} "
                             f"now has {now}; a merged report describes the preset, so retrain that task")


def _timing(parts: list[dict]) -> dict:
    """The parts' CPU and wall seconds summed, their invocations listed in order."""
    timings = [p["timing"] for p in parts]
    return {**{k: sum(t.get(k, 0) for t in timings) for k in _SUMMED},
            "cores": max(t.get("cores") or 1 for t in timings),
            "per_run_train_cpu_s": {n: s for t in timings for n, s in t.get("per_run_train_cpu_s", {}).items()},
            "jobs": max(t.get("jobs", 1) for t in timings),
            "load_start": timings[0].get("load_start"), "load_end": timings[-1].get("load_end"),
            "report_only": True, "merged_parts": len(parts),
            "invocations": [i for t in timings for i in t.get("invocations") or []]}


def _versus(parts: list[dict]) -> dict:
    """metric → other → task: every part's stored PosAug-against-row results, side by side."""
    out: dict[str, dict[str, dict]] = {}
    for part in parts:
        for metric, per_other in (part.get("versus_posaug") or {}).items():
            for other, per_task in per_other.items():
                out.setdefault(metric, {}).setdefault(other, {}).update(per_task)
    return out


def merge_reports(out: Path, paths: list[Path]) -> Path:
    """Write one report (report.md, results.json, plots) of the parts under `out`; returns the report's path."""
    from pretrain.tasks.report import write_report

    if len(paths) < 2:
        raise ValueError("--merge needs two or more results.json files; a single one has its report already")
    written = (out / "results.json").resolve()
    for path in paths:
        if path.resolve() == written:
            raise ValueError(f"--output {out} would overwrite the input {path}; write the merged report elsewhere")
    if written.is_file() and "merged_from" not in json.loads(written.read_text()):
        raise ValueError(f"--output {out} holds a suite's own report; write the merged report to another directory")
    parts = [_load(path) for path in paths]
    for path, results in zip(paths, parts):
        _check_part(path, results, parts[0])
    by_task = all(sorted(map(current_name, p["methods"])) == sorted(map(current_name, parts[0]["methods"]))
                  for p in parts)
    axis, key = ("task", "train_lengths") if by_task else ("method", "methods")
    if not by_task:
        for path, results in zip(paths, parts):
            if sorted(results["train_lengths"]) != sorted(parts[0]["train_lengths"]):
                raise ValueError(f"--merge {path}: methods and tasks both differ from the first part's; merge "
                                 "parts split by task (the same methods) or by method (the same tasks)")
    name_of = str if by_task else current_name  # a method stored under a former name is the same method
    seen: dict[str, Path] = {}
    for path, results in zip(paths, parts):
        for item in results[key]:
            if name_of(item) in seen:
                raise ValueError(f"--merge: {axis} {item} is in both {seen[name_of(item)]} and {path}; give "
                                 f"each {axis} once")
            seen[name_of(item)] = path
    name = parts[0]["preset"]
    preset = PRESETS[name]
    # current names: a part stored before a rename (rope -> baseline) keeps the old one, its summary the new
    methods = tuple(current_name(m) for part in (parts if not by_task else parts[:1]) for m in part["methods"])
    tasks = seen if by_task else parts[0]["train_lengths"]
    preset = dataclasses.replace(preset, tasks={t: r for t, r in preset.tasks.items() if t in tasks}, methods=methods)
    records = [r for part in parts for r in part["records"]]
    sources = [f"{path} ({', '.join(results[key])})" for path, results in zip(paths, parts)]
    out.mkdir(parents=True, exist_ok=True)
    return write_report(out, name, preset, records, parts[0]["seeds"], _timing(parts),
                        versus=_versus(parts) if by_task else _versus_across(parts, records, list(methods)),
                        sources=sources)


def _versus_across(parts: list[dict], records: list[dict], methods: list[str]) -> dict:
    """PosAug against each row of method parts: each part's stored paired result, else an unpaired one."""
    from pretrain.tasks.verdict import aggregate
    from pretrain.tasks.versus import versus_all

    computed = versus_all(records, aggregate(records), methods)
    for metric, per_other in _versus(parts).items():
        for other, per_task in per_other.items():
            computed.setdefault(metric, {}).setdefault(other, {}).update(per_task)
    return computed
