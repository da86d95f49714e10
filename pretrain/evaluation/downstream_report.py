"""Downstream scores in the grid: `eval all DIR --downstream T1,T2` and the `eval report` table.

`eval all` keeps each run's lm-eval results JSON in <run>/downstream/ and a summary per task in
the run's record (record["downstream"][task]: metrics, stderrs, n-shot, limit, iteration, file).
A task is done for a run when its summary was made from the run's current checkpoint with the
same --num-fewshot and --limit; only the missing tasks are run, so reruns cost nothing.

`eval report` shows, per model size and method, each task's accuracy (acc_norm when the task has
it, else acc; mean over seeds) ± its standard error, and the difference to the baseline of the
same size ± the standard error of that difference. With several seeds the standard error is
the harness's per-run stderr combined for the mean (sqrt(sum se_i^2) / n): the sampling noise of
the benchmark, not the spread over seeds (that is in summary.csv as <task>/<metric> std).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import defaultdict
from pathlib import Path

from pretrain.evaluation import downstream
from pretrain.evaluation.report import DOWNSTREAM_KEY as KEY
from pretrain.evaluation.report import default_label, record_method, record_size, write_record


def done_tasks(record: dict, iteration: int, num_fewshot: int | None, limit: float | None) -> set[str]:
    """Tasks of `record` scored from checkpoint `iteration` with this --num-fewshot / --limit."""
    return {task for task, entry in (record.get(KEY) or {}).items()
            if entry.get("iteration") == iteration and entry.get("num_fewshot") == num_fewshot
            and entry.get("limit") == limit}


def carry_over(old_path: Path, record: dict, iteration: int) -> None:
    """Keep the downstream scores of a record being rewritten (same checkpoint only)."""
    try:
        old = json.loads(Path(old_path).read_text())
    except (OSError, ValueError):
        return
    kept = {t: e for t, e in (old.get(KEY) or {}).items() if e.get("iteration") == iteration}
    if kept:
        record[KEY] = {**kept, **(record.get(KEY) or {})}


def evaluate_grid(runs: list, record_path, tasks: list[str], *, num_fewshot: int | None = None,
                  limit: float | None = None, include_path: str | None = None, device: str = "cpu",
                  batch_size: int | str = 8, say=print) -> dict[str, list[str]]:
    """Add the missing downstream tasks to the records of finished runs; returns run names by outcome."""
    outcome: dict[str, list[str]] = {"evaluated": [], "current": [], "failed": []}
    todo = []
    for run in runs:
        path = record_path(run.name)
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            outcome["failed"].append(run.name)
            say(f"downstream: {run.name}: no evaluation record at {path} (its loss evaluation failed): skipped")
            continue
        missing = [t for t in tasks if t not in done_tasks(record, run.iteration, num_fewshot, limit)]
        (todo.append((run, path, record, missing)) if missing else outcome["current"].append(run.name))
    say(f"downstream {','.join(tasks)}: {len(todo)} runs to evaluate, {len(outcome['current'])} done already")
    for index, (run, path, record, missing) in enumerate(todo, 1):
        started = time.time()
        try:
            results, file = downstream.evaluate_downstream(run.path, missing, num_fewshot=num_fewshot, limit=limit,
                                                           include_path=include_path, device=device,
                                                           batch_size=batch_size)
        except (ValueError, FileNotFoundError, RuntimeError) as error:
            outcome["failed"].append(run.name)
            say(f"[{index}/{len(todo)}] {run.name}: downstream not evaluated: {error}")
            continue
        scores = downstream.task_scores(results)
        entries = record.setdefault(KEY, {})
        for task in missing:
            entries[task] = dict(scores.get(task, {}), iteration=run.iteration, num_fewshot=num_fewshot,
                                 limit=limit, results_file=str(file))
        write_record(record, path)
        outcome["evaluated"].append(run.name)
        shown = ", ".join(f"{t} {m} {scores[t][m]:.3f}" for t in missing if t in scores
                          for m in [headline_metric(scores[t])] if m)
        say(f"[{index}/{len(todo)}] {run.name}: {shown or 'evaluated'} in {time.time() - started:.0f}s")
    return outcome


def headline_metric(entry: dict) -> str | None:
    """The accuracy a table shows for a task: acc_norm if it has one, else acc (None: not an accuracy task)."""
    return next((m for m in downstream.HEADLINE_METRICS if isinstance(entry.get(m), (int, float))), None)


def _mean_se(entries: list[dict], metric: str) -> tuple[float, float]:
    values = [e[metric] for e in entries if isinstance(e.get(metric), (int, float))]
    if not values:
        return math.nan, math.nan
    ses = [e.get(f"{metric}_stderr") for e in entries if isinstance(e.get(metric), (int, float))]
    se = (math.sqrt(sum(s * s for s in ses)) / len(values) if all(isinstance(s, (int, float)) for s in ses)
          else math.nan)
    return statistics.fmean(values), se


def downstream_table(records: list[dict], baseline: str | None = None) -> str:
    """Markdown: per size and method, each task's accuracy ± stderr and Δ vs that size's baseline ± stderr."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in records:
        if r.get(KEY):
            groups[(record_size(r), r.get("label") or default_label(r["run"]))].append(r)
    if not groups:
        return ""
    columns: dict[str, str] = {}
    for runs in groups.values():
        for r in runs:
            for task, entry in r[KEY].items():
                metric = headline_metric(entry)
                if metric and task not in columns:
                    columns[task] = metric
    tasks = sorted(columns)
    stats = {key: {t: _mean_se([r[KEY][t] for r in runs if t in r[KEY]], columns[t]) for t in tasks}
             for key, runs in groups.items()}
    is_base = {key: baseline is not None and baseline in (key[1], record_method(runs[0]))
               for key, runs in groups.items()}
    base = {key[0]: stats[key] for key in groups if is_base[key]}
    size_order = {size: runs[0].get("parameters") or 0 for (size, _), runs in groups.items()}
    header = "| size | method | n | " + " | ".join(f"{t} {columns[t]} | Δ {t}" for t in tasks) + " |"
    lines = [header, "|---|---|---|" + "---|---|" * len(tasks)]
    for key in sorted(groups, key=lambda k: (size_order[k[0]], k[0], not is_base[k], k[1])):
        cells = []
        for t in tasks:
            mean, se = stats[key][t]
            cells.append(_pm(mean, se))
            if is_base[key]:
                cells.append("(baseline)")
            elif key[0] in base and math.isfinite(mean) and math.isfinite(base[key[0]][t][0]):
                b_mean, b_se = base[key[0]][t]
                cells.append(_pm(mean - b_mean, math.hypot(se, b_se), sign=True))
            else:
                cells.append("—")
        method = record_method(groups[key][0])
        lines.append(f"| {key[0]} | {method} | {len(groups[key])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _pm(mean: float, se: float, sign: bool = False) -> str:
    if not math.isfinite(mean):
        return "—"
    text = f"{mean:+.3f}" if sign else f"{mean:.3f}"
    return text if not math.isfinite(se) else f"{text} ± {se:.3f}"
