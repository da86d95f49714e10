"""`python -m pretrain reproduce --suite ablations`: the paper's ablation Tables 5–11 at CPU scale.

The corpus, tokenizer, shards and validation spans of `reproduce` (its `prepare_data`), one
Megatron-Core run per (row, seed) with the same data order and initial weights per seed (each row
of `ablation_tables.ROWS`, shared rows once), then per run one full-context pass over spans of 8w
giving per-span in-distribution loss (targets in_start..w), loss beyond w up to 4w and up to 8w,
and the exact context gain G(4w) per span on the first spans. The report sets each table beside
the paper's numbers and checks its stated conclusions (`ablations_report`). Everything resumes:
finished runs and evaluations are reused, and an interrupted invocation leaves a report of what
finished (written after every table).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from pretrain.faults import OutputError, write_text_atomic
from pretrain.experiments.ablation_tables import PRESETS, ROWS, SHAPES, row_preset, rows_of
from pretrain.experiments.presets import Preset
from pretrain.experiments.reproduce import prepare_data, train_config
from pretrain.table import SIZES
from pretrain.tasks.suite import INVOCATIONS, invocation_id, record_invocation
from pretrain.trainer import config as config_module
from pretrain.trainer.run_pool import load_average, machine, train_in_processes

SEEDS = [42, 137, 2024] + list(range(1, 100))  # the paper's seeds first, as `reproduce`

def _log(message: str) -> None:
    print(f"[ablations] {message}", flush=True)


def shaped(architecture: dict, shape: str) -> dict:
    """model.* fields of `shape` (SHAPES: layers and hidden size scaled, heads kept, FFN in proportion)."""
    if shape == "standard":
        return {}
    layers, width = SHAPES[shape]
    heads = architecture["num_attention_heads"]
    step = 2 * heads  # head dimension stays even (RoPE rotates pairs)
    hidden = max(step, round(architecture["hidden_size"] * width / step) * step)
    ffn = max(8, round(architecture["ffn_hidden_size"] * hidden / architecture["hidden_size"] / 8) * 8)
    return {"num_layers": max(1, round(architecture["num_layers"] * layers)), "hidden_size": hidden,
            "ffn_hidden_size": ffn, "kv_channels": None}


def row_config(preset: Preset, name: str, seed: int, data_prefix: str, run_dir: Path) -> config_module.TrainConfig:
    """The TrainConfig of one (row, seed): `reproduce`'s run config with the row's positions and shape."""
    row = ROWS[name]
    raw = config_module.to_dict(train_config(row_preset(preset, row), "baseline", seed, data_prefix, run_dir))
    raw["model"].update(shaped(SIZES[preset.model].architecture, row.shape))
    raw["positions"] = dict(row.positions)
    if row.half_layers:
        raw["positions"]["layer_count"] = raw["model"]["num_layers"] // 2
    return config_module.from_dict(raw)


def _run_name(name: str, seed: int) -> str:
    return f"{name}_s{seed}"


def train_runs(out: Path, preset: Preset, names: list[str], seed: int, data_prefix: str,
               jobs: int) -> dict[str, Path]:
    """Train every row of `names` for `seed` not finished yet, `jobs` processes at a time (trainer.run_pool)."""
    from pretrain.trainer.checkpoint import latest_iteration

    runs = {name: out / "runs" / _run_name(name, seed) for name in names}
    rows = {run_dir.name: name for name, run_dir in runs.items()}
    iters = {name: row_preset(preset, ROWS[name]).train_iters for name in names}
    (out / "configs").mkdir(parents=True, exist_ok=True)

    def write_config(run: str) -> Path:
        config_file = out / "configs" / f"{run}.yaml"
        config = row_config(preset, rows[run], seed, data_prefix, runs[rows[run]])
        write_text_atomic(config_file, config_module.dump(config), what="run config")
        return config_file

    def on_start(run: str, queued: int, eta: str) -> None:
        _log(f"training {run} ({iters[rows[run]]} steps; {queued} more queued, load {load_average()}){eta}")

    def on_end(run: str, timing: dict) -> None:
        _log(f"    {run}: {timing['wall_s']:.0f} s wall, {timing['cpu_s']:.0f} s CPU")

    todo = [runs[n].name for n in names if latest_iteration(runs[n]) != iters[n]]
    train_in_processes(todo, jobs=jobs, write_config=write_config, log_dir=out / "logs", timing_dir=out / "timing",
                       on_start=on_start, on_end=on_end)
    return runs


def evaluate_run(run_dir: Path, name: str, seed: int, preset: Preset, spans) -> dict:
    """Per-span in-distribution loss, loss beyond w to 4w and to 8w, and G(4w) per span; one JSON-able record.

    Every row splits its targets at the preset's window w (Table 11's longer-window rows too, so all
    rows of a table measure the same targets). G(4w) = mean over targets t in [g, 4w) of the loss
    seeing exactly its g predecessors minus the full-context loss (g = the preset's gain window).
    """
    from pretrain.evaluation.metrics import exact_window_losses, per_position_loss
    from pretrain.evaluation.scorer_loading import load_scorer

    started = time.time()
    w, g, start = preset.window, preset.gain_window, preset.in_dist_start
    scorer = load_scorer(run_dir, backend="hf", name=name)
    losses = per_position_loss(scorer, spans).double()  # index i = target position i + 1
    record = {"row": name, "seed": seed, "run": run_dir.name, "window": w, "in_start": start,
              "train_window": w * ROWS[name].window_factor, "curve": losses.mean(0).tolist(),
              "per_span": {"in_dist": losses[:, start - 1:w].mean(1).tolist(),
                           "ood_4w": losses[:, w:4 * w - 1].mean(1).tolist(),
                           "ood_8w": losses[:, w:8 * w - 1].mean(1).tolist()}}
    if preset.gain_spans:
        head = spans[: preset.gain_spans, : 4 * w]
        # Standard RoPE at evaluation for every row, so the 4w prefix of the 8w pass is the 4w pass.
        full = losses[: preset.gain_spans, g - 1: 4 * w - 1]
        short = exact_window_losses(scorer, head, g).double()[:, g - 1:]
        record["per_span"]["gain_4w"] = (short - full).mean(1).tolist()
    record["eval_s"] = time.time() - started
    return record


def evaluate_runs(out: Path, preset: Preset, runs: dict[str, Path], seed: int, data_prefix: str) -> list[dict]:
    """Evaluate every run on the same spans, once (cached as eval/<run>.json)."""
    from pretrain.evaluation.data import eval_spans, load_stream

    spans = None
    records = []
    for name, run_dir in runs.items():
        path = out / "eval" / f"{run_dir.name}.json"
        if path.is_file():
            cached = json.loads(path.read_text())
            if cached.get("in_start") == preset.in_dist_start:
                records.append(cached)
                continue
            _log(f"    {path} holds a cliff measured from target {cached.get('in_start', '(not recorded)')}, not from "
                 f"{preset.in_dist_start} (pretrain/evaluation/ranges.py): evaluating again")
        if spans is None:
            spans = eval_spans(load_stream(data_prefix), preset.num_spans, preset.eval_length)
        record = evaluate_run(run_dir, name, seed, preset, spans)
        write_text_atomic(path, json.dumps(record), what="evaluation record")
        records.append(record)
        in_dist = sum(record["per_span"]["in_dist"]) / preset.num_spans
        ood = sum(record["per_span"]["ood_4w"]) / preset.num_spans
        _log(f"    eval {run_dir.name}: in-dist {in_dist:.3f}, cliff@4w {ood - in_dist:.3f} "
             f"({record['eval_s']:.0f} s, load {load_average()})")
    return records


def _timings(out: Path) -> dict:
    runs = {p.stem: json.loads(p.read_text()) for p in sorted((out / "timing").glob("*.json"))
            if p.name != INVOCATIONS} if (out / "timing").is_dir() else {}
    invocations = json.loads(p.read_text()) if (p := out / "timing" / INVOCATIONS).is_file() else []
    return {"train_cpu_s": sum(t["cpu_s"] for t in runs.values()), "train_wall_s": sum(t["wall_s"] for t in runs.values()),
            "runs_timed": len(runs), "invocations": invocations, "cores": os.cpu_count()}


def run_suite(out: Path, preset: Preset, preset_name: str, tables: list[int], seeds: list[int],
              corpus: str | None = None, jobs: int = 1, report_only: bool = False) -> Path:
    """Train, evaluate and report, one (seed, table) block at a time; the report is rewritten after each."""
    from pretrain.experiments.ablations_report import write_report

    started, load_start, invocation = time.time(), load_average(), invocation_id()
    out.mkdir(parents=True, exist_ok=True)
    before = set((out / "timing").glob("*.json")) if (out / "timing").is_dir() else set()
    data_prefix = None if report_only else prepare_data(out, preset, corpus)
    records: dict[str, dict] = {}
    report = out / "report.md"
    for seed in seeds:
        for number in tables:
            names = rows_of([number])
            if report_only:
                for name in names:
                    path = out / "eval" / f"{_run_name(name, seed)}.json"
                    if path.is_file():
                        records[path.stem] = json.loads(path.read_text())
            else:
                runs = train_runs(out, preset, names, seed, data_prefix, jobs)
                for record in evaluate_runs(out, preset, runs, seed, data_prefix):
                    records[record["run"]] = record
                record_invocation(out, {
                    "invocation": invocation, "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
                    "wall_s": time.time() - started, "jobs": jobs, "load_start": load_start, "load_end": load_average(),
                    "runs_trained": len(set((out / "timing").glob("*.json")) - before - {out / "timing" / INVOCATIONS}),
                    "seeds": seeds, "tables": tables, "machine": machine()})
            if records:
                report = write_report(out, preset_name, preset, tables, list(records.values()), _timings(out),
                                      planned={"seeds": seeds, "tables": tables})
                _log(f"report ({len(records)} evaluated runs): {report}")
    if not records:
        raise FileNotFoundError(f"no evaluated runs under {out / 'eval'}; run without --report-only first")
    return report


def main(argv: list[str]) -> int:
    """CLI of `python -m pretrain reproduce --suite ablations`."""
    from pretrain.cli import seeds_of
    from pretrain.experiments.reproduce_cli import ablations_parser

    args = ablations_parser().parse_args(argv)
    for flag in ("jobs",):
        if getattr(args, flag) < 1:
            print(f"error: --{flag} {getattr(args, flag)} must be >= 1", file=sys.stderr)
            return 2
    try:
        report = run_suite(Path(args.output), PRESETS[args.preset], args.preset, args.tables, seeds_of(args),
                           args.corpus, args.jobs, args.report_only)
    except (ValueError, FileNotFoundError, OutputError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    _log(f"report: {report}")
    return 0
