"""`python -m pretrain reproduce --suite documents`: does position augmentation still remove the cliff
when every document starts at position 0?

The reproduction's pipeline (same data, seeds, spans, scorer: pretrain.experiments.reproduce) over a
document-masking axis: baseline, PosAug and RFS, each trained on plain windows and with
data.document_masking=true (attention masked at every EOD, positions restarting per document; nothing
else differs, data.eod_mask_loss stays false in both arms). Every run is evaluated the same way, on
the same contiguous validation spans at 8x the window with the method's evaluation positions, so the
cliffs compare across arms. Paired statistics are span by span on the same tokens: within an arm
against that arm's baseline (cliff reduction, penalty), and across arms for one method (how much
document masking changes its cliff). Each seed may run as its own invocation (`--seed 42`) into one
--output; a run over all seeds then reuses them and writes the report.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from pretrain.faults import OutputError, write_text_atomic
from pretrain.cli import Parser, add_seeds, existing_input, seeds_of
from pretrain.experiments.presets import PRESETS, Preset
from pretrain.trainer import config as config_module

METHODS = ("baseline", "posaug", "rfs")
ARMS = {"plain": False, "docmask": True}  # arm name -> data.document_masking


def _log(message: str) -> None:
    print(f"[reproduce documents] {message}", flush=True)


def run_name(method: str, arm: str, seed: int) -> str:
    """Run and record name: baseline_s42 (plain windows) or baseline+docmask_s42."""
    return f"{method}{'' if arm == 'plain' else '+' + arm}_s{seed}"


def train_all(out: Path, preset: Preset, seeds: list[int], data_prefix: str) -> dict[tuple[str, str, int], Path]:
    """Train every (method, arm, seed) not finished yet, one `python -m pretrain train` process each."""
    from pretrain.experiments.reproduce import train_config
    from pretrain.trainer.checkpoint import latest_iteration

    runs = {}
    jobs = [(m, a, s) for s in seeds for a in ARMS for m in METHODS]
    for index, (method, arm, seed) in enumerate(jobs, 1):
        name = run_name(method, arm, seed)
        run_dir = out / "runs" / name
        runs[(method, arm, seed)] = run_dir
        if latest_iteration(run_dir) == preset.train_iters:
            _log(f"[{index}/{len(jobs)}] {name}: finished earlier, reusing {run_dir}")
            continue
        config = train_config(preset, method, seed, data_prefix, run_dir)
        config.name = name
        config.data.document_masking = ARMS[arm]
        config_file = out / "configs" / f"{name}.yaml"
        write_text_atomic(config_file, config_module.dump(config), what="run config")
        started = time.time()
        _log(f"[{index}/{len(jobs)}] training {name} ({preset.train_iters} steps)")
        proc = subprocess.run([sys.executable, "-m", "pretrain", "train", "--config", str(config_file)])
        if proc.returncode != 0:
            raise RuntimeError(f"training {name} failed with exit code {proc.returncode} (config {config_file})")
        _log(f"[{index}/{len(jobs)}] {name} trained in {(time.time() - started) / 60:.1f} min")
    return runs


def evaluate_all(out: Path, preset: Preset, runs: dict, data_prefix: str) -> list[dict]:
    """Per-span cliff records of every run on the same validation spans; cached as JSON under eval/."""
    from pretrain.evaluation.data import eval_spans, load_stream
    from pretrain.experiments.reproduce import evaluate_run

    spans = eval_spans(load_stream(data_prefix), preset.num_spans, preset.eval_length)
    records = []
    for (method, arm, seed), run_dir in runs.items():
        name = run_name(method, arm, seed)
        path = out / "eval" / f"{name}.json"
        if path.is_file():
            records.append(json.loads(path.read_text()))
            continue
        started = time.time()
        record = evaluate_run(run_dir, method, seed, preset, spans)
        record.update(run=name, label=name.rsplit("_s", 1)[0], method=method, arm=arm)
        write_text_atomic(path, json.dumps(record), what="evaluation record")
        records.append(record)
        cliff = record["lengths"][str(preset.eval_length)]["cliff"]
        _log(f"[eval] {name}: cliff {cliff['cliff']:.3f} (in-dist {cliff['in_dist']:.3f}) "
             f"in {time.time() - started:.0f}s")
    return records


def _span_cliffs(record: dict) -> torch.Tensor:
    return (torch.tensor(record["per_span"]["ood"], dtype=torch.float64)
            - torch.tensor(record["per_span"]["in_dist"], dtype=torch.float64))


def summarise(records: list[dict], preset: Preset) -> dict:
    """Per arm and method: the reproduction's summary (vs the arm's baseline) and the docmask − plain cliff change."""
    from pretrain.evaluation.metrics import paired_reduction
    from pretrain.evaluation.report import mean_std
    from pretrain.experiments.reproduce import summarise as summarise_arm

    summary = {}
    for arm in ARMS:
        arm_records = [dict(r, label=r["method"]) for r in records if r["arm"] == arm]
        for method, entry in summarise_arm(arm_records, preset).items():
            summary[f"{method}{'' if arm == 'plain' else '+' + arm}"] = dict(entry, method=method, arm=arm)
    by_key = {(r["method"], r["arm"], r["seed"]): r for r in records}
    for method in METHODS:
        changes, ses = [], []
        for (m, arm, seed), record in by_key.items():
            plain = by_key.get((method, "plain", seed))
            if m == method and arm == "docmask" and plain is not None:
                # paired_reduction gives plain − docmask; the change is docmask − plain.
                reduction, se = paired_reduction(_span_cliffs(plain), _span_cliffs(record))
                changes.append(-reduction)
                ses.append(se)
        if changes and f"{method}+docmask" in summary:
            summary[f"{method}+docmask"]["cliff_change"] = mean_std(changes)
            summary[f"{method}+docmask"]["cliff_change_se"] = mean_std(ses)
    return summary


def _fmt(pair, digits: int = 3) -> str:
    if pair is None:
        return "–"
    mean, std = pair
    return f"{mean:.{digits}f}" + ("" if std != std else f" ± {std:.{digits}f}")


def write_report(out: Path, preset_name: str, preset: Preset, summary: dict, records: list[dict],
                 seeds: list[int]) -> Path:
    """report.md (one table), results.json and per_position_loss.png in `out`."""
    from pretrain.evaluation.report import plot_loss_curves

    plot = plot_loss_curves(records, out / "per_position_loss.png")
    lines = [f"# Document masking and the cliff ({preset_name}: w={preset.window}, {preset.train_tokens:,} training "
             f"tokens ({preset.train_iters} steps) per run, eval {preset.eval_length}, {preset.num_spans} spans, "
             f"seeds {seeds})", "",
             "mean ± sd over seeds; SEs are span-level paired standard errors (mean over seeds). Reduction and "
             "penalty are against the same arm's baseline; 'docmask − plain' is the method's cliff with document "
             "masking minus without it (positive: masking grows the cliff).", "",
             "| run | in-dist | beyond w | cliff | cliff SE | reduction vs arm baseline | paired SE | penalty "
             "| docmask − plain cliff | its SE |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for arm in ARMS:
        for method in METHODS:
            key = f"{method}{'' if arm == 'plain' else '+' + arm}"
            e = summary.get(key)
            if e is None:
                continue
            cells = [_fmt(e.get(k)) for k in ("in_dist", "ood", "cliff", "cliff_se", "paired_reduction", "paired_se",
                                                "penalty", "cliff_change", "cliff_change_se")]
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines += ["", f"![per-position loss]({plot.name})", ""]
    report = out / "report.md"
    write_text_atomic(report, "\n".join(lines), what="report")
    write_text_atomic(out / "results.json", json.dumps({"preset": preset_name, "preset_fields": dataclasses.asdict(
        preset), "seeds": seeds, "summary": summary, "records": records}, indent=1, default=str), what="results")
    return report


def main(argv: list[str]) -> int:
    """CLI of `python -m pretrain reproduce --suite documents`."""
    parser = Parser(prog="python -m pretrain reproduce --suite documents", description=__doc__.split("\n")[0])
    parser.add_argument("--output", default="reproduce_documents_out", help="working and report directory (resumable)")
    parser.add_argument("--input", dest="corpus", default=None, type=existing_input,
                   help="a JSONL/text corpus instead of the embedded one")
    parser.add_deprecated("--corpus", "corpus", "--input")
    parser.add_argument("--preset", default="cpu-small", choices=sorted(PRESETS))
    parser.add_argument("--train-tokens", type=int, default=None,
                        help="tokens per training run instead of the preset's (a shorter run on a busy machine)")
    add_seeds(parser, default_count=2)
    parser.add_argument("--train-only", action="store_true",
                        help="train and evaluate the seeds asked for, then stop without the report (one invocation "
                             "per seed; a later run with every seed reuses them and writes the report)")
    parser.add_argument("--prepare-only", action="store_true", help="build the data and stop")
    args = parser.parse_args(argv)
    try:
        seeds = seeds_of(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from pretrain.experiments.reproduce import prepare_data

    out = Path(args.output)
    # G(C) needs a pass per target token and is not part of this question: skipped.
    preset = dataclasses.replace(PRESETS[args.preset], gain_spans=0)
    if args.train_tokens is not None:
        if args.train_tokens < preset.global_batch_size * preset.window:
            print(f"error: --train-tokens must be at least one step ({preset.global_batch_size * preset.window} "
                  f"tokens for {args.preset}; got {args.train_tokens})", file=sys.stderr)
            return 2
        preset = dataclasses.replace(preset, train_tokens=args.train_tokens)
    try:
        out.mkdir(parents=True, exist_ok=True)
        data_prefix = prepare_data(out, preset, args.corpus)
        if args.prepare_only:
            return 0
        runs = train_all(out, preset, seeds, data_prefix)
        records = evaluate_all(out, preset, runs, data_prefix)
        if args.train_only:
            _log(f"seeds {seeds} done; run without --train-only to write the report")
            return 0
        report = write_report(out, args.preset, preset, summarise(records, preset), records, seeds)
        _log(f"report: {report}")
        print(report.read_text(), flush=True)
    except (ValueError, FileNotFoundError, OutputError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
