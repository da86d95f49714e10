"""A `reproduce --slurm` grid's status table, and the stages its data / eval / report jobs run."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from pretrain.faults import write_text_atomic
from pretrain.experiments.grid_plan import (PRESETS, Spec, eval_labels, eval_path, evaluated, load_state,
                                            parse_run_name, run_name, size_preset)

def _last_loss(out: Path, group: str, task: str | None) -> str:
    if not task or "_" not in task:
        return "-"
    log = out / "logs" / f"train-{group}-{task}.out"
    try:
        found = re.findall(r"step \d+/\d+ \| loss (\S+)", log.read_text(errors="replace"))
    except OSError:
        return "-"
    return found[-1] if found else "-"


def status(spec: Spec, live: dict[str, str]) -> str:
    """The grid as a table: every run's state, job, step, last loss and evaluation; then the report."""
    from pretrain.runs import inspect_run

    out = Path(spec.out)
    jobs = load_state(out).get("jobs", {"train": {}, "eval": {}})
    header = ("run", "state", "job", "step", "last loss", "evaluated")
    rows, counts = [], {}
    for size, method, seed in spec.runs():
        name = run_name(size, method, seed)
        run_dir = out / "runs" / name
        job = jobs["train"].get(name)
        run = inspect_run(run_dir) if (run_dir / "config.yaml").is_file() else None
        if run is not None and run.finished:
            state = "finished"
        elif job in live:
            state = live[job].lower()
        elif run is not None:
            state = run.state if run.state != "running" else "failed"  # not in the queue: it cannot be running
        else:
            state = "not submitted" if job is None else "failed"
        step = f"{run.iteration}/{run.train_iters}" if run is not None else "-"
        eval_job = jobs["eval"].get(name)
        done = evaluated(spec, size, method, seed)
        evaluation = "yes" if done else (f"{live[eval_job].lower()} ({eval_job})" if eval_job in live else "no")
        rows.append((name, state, job or "-", step, _last_loss(out, f"{size}_{method}", job), evaluation))
        counts[state] = counts.get(state, 0) + 1
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    report, report_job = out / "report.md", jobs.get("report")
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()) + f" ({len(rows)} runs)")
    lines.append(f"report: {report}" + ("" if report.is_file() else " (not written yet)")
                 + (f"; report job {report_job} {live[report_job].lower()}" if report_job in live else ""))
    return "\n".join(lines)


# ---- stages (inside the jobs) -----------------------------------------------------------------------------

def stage_data(spec: Spec) -> None:
    """CPU presets: corpus → tokenizer → shards, as `reproduce` does in one process."""
    from pretrain.experiments.reproduce import prepare_data

    prefix = prepare_data(Path(spec.out), PRESETS[spec.preset], spec.corpus)
    if prefix != spec.data_prefix:
        raise RuntimeError(f"data written to {prefix}, but the grid trains on {spec.data_prefix}")


def stage_eval(spec: Spec, name: str) -> None:
    """One run's evaluation record(s), cached where the report reads them."""
    from pretrain.experiments.reproduce import evaluate_runs

    size, method, seed = parse_run_name(name)
    run_dir = Path(spec.out) / "runs" / name
    preset = size_preset(spec, size)
    evaluate_runs(Path(spec.out) / "results" / size, preset, {f"{method}_s{seed}": run_dir},
                  [seed] if method == "baseline" else [], spec.data_prefix)


def stage_report(spec: Spec) -> Path:
    """Per size the report `reproduce` writes, from what finished; OUT/report.md gathers them, missing runs named."""
    from pretrain.experiments.reproduce import summarise
    from pretrain.experiments.reproduce_report import write_report

    out = Path(spec.out)
    state = load_state(out)
    elapsed = time.time() - state.get("created", time.time())
    sections = [f"# Grid report — `reproduce --slurm --preset {spec.preset}`\n\n"
                f"Sizes {', '.join(spec.sizes)}; methods {', '.join(spec.methods)}; seeds "
                f"{', '.join(map(str, spec.seeds))}. Runs in `{out / 'runs'}`; `--status` shows the grid."]
    for size in spec.sizes:
        preset = size_preset(spec, size)
        records, missing = [], []
        for method in spec.methods:
            for seed in spec.seeds:
                for label in eval_labels(method):
                    if label != method and label not in preset.inference:
                        continue
                    path = eval_path(spec, size, label, seed)
                    if path.is_file():
                        records.append(json.loads(path.read_text()))
                    else:
                        missing.append(f"{label} seed {seed}" + ("" if label == method else
                                                                  f" (from {run_name(size, method, seed)})"))
        text = f"## {size}\n\n"
        if records:
            directory = out / "results" / size
            seeds = sorted({r["seed"] for r in records})
            write_report(directory, spec.preset, preset, summarise(records, preset), records, seeds, elapsed)
            body = (directory / "report.md").read_text().split("\n", 1)[1].strip()
            text += re.sub(r"\]\(([^)/]+\.png)\)", rf"](results/{size}/\1)", body)
        else:
            text += "No run of this size has been evaluated yet."
        text += ("\n\n**Missing** (not trained or not evaluated yet; rerun the same command to resubmit): "
                 + ", ".join(missing) + "." if missing else "\n\nNo run missing.")
        sections.append(text)
    write_text_atomic(out / "report.md", "\n\n".join(sections) + "\n", what="grid report",
                      elsewhere="pass an --output on a larger disk", then="rerun the report stage")
    return out / "report.md"
