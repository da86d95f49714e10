"""`python -m pretrain reproduce`: the paper's comparison at CPU scale, from corpus to report.

data_prep (corpus → SentencePiece → shards) → one Megatron-Core training run per (method,
seed), all with the same data order and initialisation per seed → evaluation at 8× the
window on identical validation spans → report.md, results.json and plots. Every stage is
resumable: finished data, runs and evaluations are reused on a rerun.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import torch

from pretrain.faults import write_text_atomic
from pretrain.experiments.presets import INFERENCE, PRESETS, TRAINING_METHODS, Preset
from pretrain.table import METHODS, former_name_hint
from pretrain.trainer import config as config_module
from pretrain.trainer.config import TrainConfig

_ELSEWHERE = {"elsewhere": "pass an --output on a larger disk", "then": "rerun the same command (finished runs "
              "and evaluations are kept)"}


def _log(message: str) -> None:
    print(f"[reproduce] {message}", flush=True)


def prepare_data(out: Path, preset: Preset, corpus: str | None) -> str:
    """Corpus → SentencePiece tokenizer → shards + validation stream; returns the data prefix."""
    from data_prep.cli import main as data_prep
    from data_prep.manifest import load_manifest

    data = out / "data"
    prefix = str(data / "shards" / "corpus")
    if corpus is None:
        corpus = str(data / "corpus")
        if not Path(corpus).is_dir():
            _log(f"writing the embedded corpus (Python standard library text, {preset.corpus_bytes:,} bytes max)")
            if data_prep(["embedded-corpus", "--output", corpus, "--max-bytes", str(preset.corpus_bytes)]):
                raise RuntimeError("embedded-corpus failed")
    tokenizer = data / "tokenizer"
    if not (tokenizer / "tokenizer.model").is_file():
        _log(f"training a {preset.vocab_size}-token SentencePiece BPE tokenizer on {corpus}")
        if data_prep(["train-tokenizer", "--input", corpus, "--output", str(tokenizer), "--kind",
                      "sentencepiece-bpe", "--vocab-size", str(preset.vocab_size)]):
            raise RuntimeError("train-tokenizer failed")
    # data_prep resumes by itself: complete shards are verified and kept
    _log("tokenising into Megatron shards")
    if data_prep(["build", "--input", corpus, "--tokenizer", str(tokenizer), "--data-prefix", prefix,
                  "--valid-fraction", str(preset.valid_fraction), "--no-progress"]):
        raise RuntimeError("data_prep build failed")
    manifest = load_manifest(prefix)
    need = preset.num_spans * preset.eval_length
    if manifest.num_valid_tokens < need:
        raise ValueError(f"the validation stream has {manifest.num_valid_tokens:,} tokens; {preset.num_spans} spans "
                         f"of {preset.eval_length} need {need:,}: use a larger corpus (--input) or fewer spans")
    return prefix


def train_config(preset: Preset, method: str, seed: int, data_prefix: str, run_dir: Path,
                 overrides: Sequence[str] = ()) -> TrainConfig:
    """The TrainConfig of one run (same seed ⇒ same data order and initial weights for every method)."""
    iters = preset.train_iters
    row = METHODS[method]
    return config_module.from_dict(config_module.apply_overrides({
        "name": run_dir.name, "seed": seed, "preset": preset.model,
        "model": {"seq_length": preset.window, "vocab_size": preset.vocab_size, **row.model_fields(preset.window)},
        "positions": row.position_fields(preset.window),
        "data": {"data_path": data_prefix},
        "schedule": {"train_iters": iters, "global_batch_size": preset.global_batch_size,
                     "micro_batch_size": preset.micro_batch_size},
        "optimizer": {"lr": preset.lr, "min_lr": preset.lr / 10, "lr_warmup_iters": max(1, iters // 20),
                      "weight_decay": 0.1, "clip_grad": 1.0},
        "checkpoint": {"save": str(run_dir), "save_interval": max(1, iters // 4), "keep_last": 1},
        "logging": {"log_interval": max(1, iters // 8), "eval_interval": iters, "eval_iters": 2},
    }, list(overrides)))


class TrainingFailed(Exception):
    """A run's training process exited non-zero (its own error is printed above, by the trainer)."""

    def __init__(self, name: str, exit_code: int, config_file: Path):
        self.exit_code = exit_code
        super().__init__(f"training {name} failed with exit code {exit_code} (its error is above; config "
                         f"{config_file}); the same command resumes it and keeps the finished runs")


def train_runs(out: Path, preset: Preset, seeds: list[int], data_prefix: str,
               overrides: Sequence[str] = ()) -> dict[str, Path]:
    """Train every (method, seed) not finished yet; returns run name → run dir.

    Each run is one `python -m pretrain train --config <resolved YAML>` process: a fresh
    process per run keeps Megatron's global state and memory from leaking between runs.
    """
    from pretrain.trainer.checkpoint import latest_iteration

    runs = {f"{m}_s{s}": (m, s) for s in seeds for m in preset.methods}
    iters = preset.train_iters
    started, trained = time.time(), 0
    for index, (name, (method, seed)) in enumerate(runs.items(), 1):
        run_dir = out / "runs" / name
        if latest_iteration(run_dir) == iters:
            _log(f"[{index}/{len(runs)}] {name}: finished earlier, reusing {run_dir}")
            continue
        remaining = sum(1 for n in list(runs)[index - 1:] if latest_iteration(out / "runs" / n) != iters)
        eta = (time.time() - started) / trained * remaining if trained else None
        _log(f"[{index}/{len(runs)}] training {name} ({iters} steps)"
             + (f"; ETA for the remaining {remaining} runs {eta / 60:.1f} min" if eta else ""))
        config_file = out / "configs" / f"{name}.yaml"
        write_text_atomic(config_file, config_module.dump(train_config(preset, method, seed, data_prefix, run_dir,
                                                                         overrides)),
                          what="run config", **_ELSEWHERE)
        proc = subprocess.run([sys.executable, "-m", "pretrain", "train", "--config", str(config_file)])
        if proc.returncode != 0:
            raise TrainingFailed(name, proc.returncode, config_file)
        trained += 1
    return {name: out / "runs" / name for name in runs}


def evaluate_run(run_dir: Path, label: str, seed: int, preset: Preset, spans: torch.Tensor,
                 rope_scaling: str | None = None, backend: str | None = None) -> dict:
    """Per-span losses at evaluation positions, cliff pieces per span, exact G(C); one JSON-able record.

    backend None: load_scorer's "auto" (transformers where the checkpoint exports, else the Megatron model).
    """
    from pretrain.evaluation.metrics import context_gain, per_position_loss, span_cliffs
    from pretrain.evaluation.scorer_loading import load_scorer

    # What HF cannot express (NoPE, ALiBi, NoPE-interleave, SSMax) is scored by the Megatron model itself
    # (load_scorer's "auto"; same losses, tested).
    scorer = load_scorer(run_dir, backend=backend or "auto", rope_scaling=rope_scaling, name=label,
                         device="cuda" if torch.cuda.is_available() else "cpu")  # a GPU node of `--slurm`
    losses = per_position_loss(scorer, spans).double()  # [n, L-1]; index i = target position i+1
    per_span = span_cliffs(losses, preset.window, in_start=preset.in_dist_start)
    contexts = [c for c in (2 * preset.window, 4 * preset.window, 8 * preset.window) if c <= preset.eval_length]
    gain = (context_gain(scorer, spans[: preset.gain_spans], contexts, window=preset.gain_window, method="exact")
            if preset.gain_spans else None)
    curve = losses.mean(0)
    in_dist, ood = per_span["in_dist"].mean().item(), per_span["ood"].mean().item()
    return {"run": f"{label}_s{seed}", "label": label, "seed": seed, "train_window": preset.window,
            "strategy": label, "rope_scaling": rope_scaling,
            "lengths": {str(preset.eval_length): {
                "loss": curve.mean().item(), "curve": curve.tolist(),
                "cliff": {"in_dist": in_dist, "ood": ood, "cliff": ood - in_dist, "in_start": preset.in_dist_start}}},
            "per_span": {"in_dist": per_span["in_dist"].tolist(), "ood": per_span["ood"].tolist()},
            "context_gain": gain}


def evaluate_runs(out: Path, preset: Preset, runs: dict[str, Path], seeds: list[int], data_prefix: str) -> list[dict]:
    """Evaluate every run (and the baseline under PI/NTK/YaRN) on the same spans; cached as JSON."""
    from pretrain.evaluation.data import eval_spans, load_stream

    spans = eval_spans(load_stream(data_prefix), preset.num_spans, preset.eval_length)
    jobs = [(name.rsplit("_s", 1)[0], seed, run_dir, None) for name, run_dir in runs.items()
            for seed in [int(name.rsplit("_s", 1)[1])]]
    jobs += [(label, seed, runs[f"baseline_s{seed}"], kind) for seed in seeds
             for label, kind in INFERENCE.items() if label in preset.inference]
    records = []
    for index, (label, seed, run_dir, kind) in enumerate(jobs, 1):
        path = out / "eval" / f"{label}_s{seed}.json"
        if path.is_file():
            try:
                cached = json.loads(path.read_text())
            except ValueError:  # a half-written record (from before records were written atomically): redo it
                _log(f"{path} is damaged (not valid JSON): evaluating again")
            else:
                used = cached.get("lengths", {}).get(str(preset.eval_length), {}).get("cliff", {}).get("in_start")
                if used == preset.in_dist_start:
                    records.append(cached)
                    continue
                _log(f"{path} holds a cliff measured from target {used or '(not recorded)'}, not from "
                     f"{preset.in_dist_start} (pretrain/evaluation/ranges.py): evaluating again")
        started = time.time()
        record = evaluate_run(run_dir, label, seed, preset, spans, rope_scaling=kind)
        write_text_atomic(path, json.dumps(record), what="evaluation record", **_ELSEWHERE)
        records.append(record)
        cliff = record["lengths"][str(preset.eval_length)]["cliff"]
        _log(f"[eval {index}/{len(jobs)}] {label} seed {seed}: cliff {cliff['cliff']:.3f} "
             f"(in-dist {cliff['in_dist']:.3f}, beyond w {cliff['ood']:.3f}) in {time.time() - started:.0f}s")
    return records


def summarise(records: list[dict], preset: Preset) -> dict:
    """Per label: mean ± sd over seeds of in-dist/OOD/cliff/penalty/G, cliff SE, paired reduction vs baseline."""
    from pretrain.evaluation.metrics import in_distribution_penalty, paired_reduction, per_span_cliffs, standard_error
    from pretrain.evaluation.report import mean_std

    from pretrain.evaluation.pairing import pair_by_seed

    length = str(preset.eval_length)
    by_label: dict[str, list[tuple[dict, dict | None]]] = {}
    for record, base in pair_by_seed(records, lambda r: r["label"] == "baseline"):
        by_label.setdefault(record["label"], []).append((record, base))

    def span_cliffs(record: dict) -> torch.Tensor:
        return per_span_cliffs(record["per_span"])

    summary = {}
    for label, group in by_label.items():
        rows = []
        for r, base in group:
            cliff = r["lengths"][length]["cliff"]
            row = {"in_dist": cliff["in_dist"], "ood": cliff["ood"], "cliff": cliff["cliff"],
                   "cliff_se": standard_error(span_cliffs(r)), "gain": (r.get("context_gain") or {}).get("values", {})}
            if base is not None:
                reduction, se = paired_reduction(span_cliffs(base), span_cliffs(r))
                row["paired_reduction"] = reduction
                row["paired_se"] = se if label != "baseline" else 0.0
                row["penalty"] = in_distribution_penalty(cliff["in_dist"], base["lengths"][length]["cliff"]["in_dist"])
            rows.append(row)
        entry = {"n": len(rows), "seeds": [r["seed"] for r, _ in group]}
        for key in ("in_dist", "ood", "cliff", "cliff_se", "paired_reduction", "paired_se", "penalty"):
            values = [row[key] for row in rows if key in row]
            if values:
                entry[key] = mean_std(values)
        contexts = sorted({int(c) for row in rows for c in row["gain"]})
        entry["gain"] = {c: mean_std([row["gain"][str(c)] if str(c) in row["gain"] else row["gain"][c]
                                      for row in rows]) for c in contexts}
        summary[label] = entry
    return summary


def reproduce(out: Path, preset: Preset, seeds: list[int], corpus: str | None = None,
              preset_name: str = "custom", overrides: Sequence[str] = ()) -> Path:
    """The whole pipeline for `preset`; returns the report path."""
    from pretrain.experiments.reproduce_report import write_report

    started = time.time()
    out.mkdir(parents=True, exist_ok=True)
    data_prefix = prepare_data(out, preset, corpus)
    runs = train_runs(out, preset, seeds, data_prefix, overrides)
    records = evaluate_runs(out, preset, runs, seeds, data_prefix)
    summary = summarise(records, preset)
    report = write_report(out, preset_name, preset, summary, records, seeds, time.time() - started)
    _log(f"report: {report}")
    print(report.read_text().split("\n\n")[2], flush=True)  # the table, last: what a user reads first
    return report


def with_methods(preset: Preset, methods: list[str] | None) -> Preset:
    """`preset` restricted to the baseline plus `methods` (ValueError names unknown ones)."""
    if not methods:
        return preset
    unknown = [m for m in methods if m not in TRAINING_METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {list(TRAINING_METHODS)}"
                         f"{former_name_hint(unknown)}")
    return dataclasses.replace(preset, methods=("baseline", *[m for m in methods if m != "baseline"]))

