"""JSON records per (run, eval), mean ± std tables over seeds, and matplotlib plots."""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Iterable

import matplotlib

matplotlib.use("Agg")  # files only; no display on clusters
import matplotlib.pyplot as plt  # noqa: E402

from .ranges import cliff_in_start  # noqa: E402


# The record field that holds lm-eval scores per task (written by downstream_report).
DOWNSTREAM_KEY = "downstream"


def default_label(run_name: str) -> str:
    """Group key of a run: its name without a trailing seed suffix (_s42, -seed137, _2024)."""
    return re.sub(r"([_-](s|seed)?\d+)$", "", run_name) or run_name


def write_record(record: dict, path: str | Path) -> Path:
    """Write one JSON record (parents created; atomically, so a full disk never leaves half a record)."""
    from pretrain.faults import write_text_atomic

    path = Path(path)
    write_text_atomic(path, json.dumps(record, indent=1, default=_json_default), what="evaluation record",
                      elsewhere="pass an --output on a larger disk", then="rerun the same command")
    return path


def _json_default(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


def load_records(paths: Iterable[str | Path]) -> list[dict]:
    """Records from JSON files and/or directories of them (*.json, recursively)."""
    records = []
    for p in paths:
        p = Path(p)
        files = sorted(p.rglob("*.json")) if p.is_dir() else [p]
        for f in files:
            data = json.loads(f.read_text())
            if isinstance(data, dict) and "run" in data and "lengths" in data:
                records.append(data)
    if not records:
        raise ValueError(f"no evaluation records found in {list(paths)}")
    return records


def record_metrics(record: dict) -> dict[str, float]:
    """Flat scalar metrics of one record: loss/in_dist/ood/cliff per L, G per C, retrieval, entropy."""
    out: dict[str, float] = {}
    for length, entry in sorted(record.get("lengths", {}).items(), key=lambda kv: int(kv[0])):
        out[f"loss@{length}"] = entry["loss"]
        if entry.get("cliff"):
            for key in ("in_dist", "ood", "cliff"):
                out[f"{key}@{length}"] = entry["cliff"][key]
    gain = record.get("context_gain")
    if gain:
        for c, value in sorted(gain["values"].items(), key=lambda kv: int(kv[0])):
            out[f"G({c})"] = value
    for task in ("passkey", "ruler_niah"):
        for length, entry in sorted((record.get(task) or {}).items(), key=lambda kv: int(kv[0])):
            out[f"{task}@{length}"] = entry["accuracy"]
    if record.get("entropy"):
        out["entropy_ratio"] = record["entropy"]["ratio"]
    out.update(downstream_metrics(record))
    return out


def downstream_metrics(record: dict) -> dict[str, float]:
    """'<task>/<metric>' for every numeric lm-eval score of a record (stderrs included; `eval all --downstream`)."""
    return {f"{task}/{metric}": value for task, entry in sorted((record.get(DOWNSTREAM_KEY) or {}).items())
            for metric, value in entry.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
            and metric not in ("iteration", "num_fewshot", "limit", "n-shot", "samples")}


def mean_std(values: list[float]) -> tuple[float, float]:
    """(mean, sample std) of the finite values; std is NaN for one value, both NaN for none."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan


def record_size(record: dict) -> str:
    """The model size a record belongs to: its `size` (set by `eval all`), else its parameter count."""
    if record.get("size"):
        return str(record["size"])
    params = record.get("parameters")
    return f"{params / 1e6:.3g}M" if params else "?"


def record_method(record: dict) -> str:
    """The method a record belongs to: its `method` (set by `eval all`), else its label; a DroPE checkpoint from
    before its switch (a RoPE model still) is named so, apart from the recalibrated run."""
    method = record.get("method") or record.get("label") or default_label(record["run"])
    phase = (record.get("run_info") or {}).get("phase")
    return f"{method} ({phase})" if phase == "pretraining" else method


def aggregate(records: list[dict], baseline: str | None = None) -> list[dict]:
    """One row per (model size, label): n, parameters, and {metric: (mean, sample std over seeds)}.

    With a baseline (a method or label), every run is compared with the baseline *of its own size and seed*
    (pretrain.evaluation.pairing, the rule `reproduce` uses): penalty@L = relative increase of in-distribution
    loss over that baseline run at the same L (the paper's in-distribution penalty), ΔG(C) = G(C) minus that
    run's G(C), reduction@L = its cliff minus this run's, span by span. row["paired"] holds each such metric's
    mean, span SE and seed SE over the seeds that have a baseline (pairing.over_seeds); row["unpaired"] names the
    runs whose seed has none: they get no penalty, ΔG or reduction (never the mean of other seeds' baselines).
    """
    from .pairing import over_seeds, pair_by_seed

    groups: dict[tuple[str, str], list[tuple[dict, dict | None]]] = defaultdict(list)
    label_of = {id(r): r.get("label") or default_label(r["run"]) for r in records}
    method_of = {label_of[id(r)]: record_method(r) for r in records}
    is_baseline = {label: baseline is not None and baseline in (label, method) for label, method in method_of.items()}
    if baseline is not None and not any(is_baseline.values()):
        raise ValueError(f"baseline {baseline!r} is not among the runs' labels {sorted(method_of)} "
                         f"or methods {sorted(set(method_of.values()))}")
    for r, base in pair_by_seed(records, lambda r: is_baseline[label_of[id(r)]], group=record_size):
        groups[(record_size(r), label_of[id(r)])].append((r, base if baseline is not None else None))
    rows = []
    for (size, label), pairs in groups.items():
        per_run = [record_metrics(r) for r, _ in pairs]
        for (r, base), m in zip(pairs, per_run):
            if base is not None:
                m.update(_versus_baseline(base, r, m))
        keys = list(dict.fromkeys(k for m in per_run for k in m))
        paired = {k: over_seeds([m[k] for m in per_run if k in m],
                                [m[f"reduction_se@{k[10:]}"] for m in per_run if k in m]
                                if k.startswith("reduction@") else None)
                  for k in keys if k.startswith(("penalty@", "ΔG(", "reduction@"))}
        r0 = pairs[0][0]
        rows.append({"label": label, "size": size, "method": record_method(r0), "n": len(pairs),
                     "seeds": [r.get("seed") for r, _ in pairs], "is_baseline": is_baseline[label],
                     "parameters": r0.get("parameters"), "strategy": r0.get("strategy"),
                     "train_window": r0.get("train_window"), "paired": paired,
                     "unpaired": [r["run"] for r, base in pairs if base is None and baseline is not None],
                     "metrics": {k: mean_std([m.get(k) for m in per_run]) for k in keys}})
    # sizes small to large; within a size the baseline first
    rows.sort(key=lambda row: (row["parameters"] or 0, row["size"], not row["is_baseline"], row["label"]))
    return rows


def pairing_notes(rows: list[dict], baseline: str | None) -> list[str]:
    """One line per run that has no baseline of its own size and seed (so no penalty, ΔG or reduction)."""
    return [f"{run} (size {row['size']}): no {baseline!r} run of the same size and seed, so no penalty, ΔG or "
            f"paired cliff reduction for it (evaluate that seed's baseline, or pass --baseline)"
            for row in rows for run in row.get("unpaired", [])]


def _versus_baseline(base: dict, record: dict, metrics: dict[str, float]) -> dict[str, float]:
    """penalty@L and ΔG(C) against the baseline run of the same size and seed, and (another run) reduction@L."""
    from .metrics import in_distribution_penalty

    theirs = record_metrics(base)
    out = {f"penalty@{k[8:]}": in_distribution_penalty(v, theirs[k]) for k, v in metrics.items()
           if k.startswith("in_dist@") and k in theirs}
    out.update({f"Δ{k}": v - theirs[k] for k, v in metrics.items() if k.startswith("G(") and k in theirs})
    return out if base is record else {**out, **_paired(base, record)}


def _paired(base: dict, record: dict) -> dict[str, float]:
    """reduction@L / reduction_se@L: the baseline's cliff minus this run's, paired span by span (reproduce's rule)."""
    from .metrics import paired_reduction, per_span_cliffs

    out = {}
    for length in record.get("lengths", {}):
        mine, theirs = _spans(record, length), _spans(base, length)
        if mine and theirs and len(mine["ood"]) == len(theirs["ood"]) and base.get("data") == record.get("data"):
            out[f"reduction@{length}"], out[f"reduction_se@{length}"] = paired_reduction(
                per_span_cliffs(theirs), per_span_cliffs(mine))
    return out


def _spans(record: dict, length: str) -> dict | None:
    """A record's per-span pieces at `length`: `eval run` keeps them per length, `reproduce` (one length) on top."""
    entry = record.get("lengths", {}).get(length, {})
    return entry.get("per_span") or (record.get("per_span") if len(record.get("lengths", {})) == 1 else None)


def _fmt(mean: float, std: float, digits: int = 3) -> str:
    if not math.isfinite(mean):
        return "—"
    return f"{mean:.{digits}f}" if not math.isfinite(std) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def _metric_keys(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(k for row in rows for k in row["metrics"]))


def write_csv(rows: list[dict], path: str | Path) -> Path:
    """CSV with label, n, parameters and <metric>_mean / <metric>_std columns."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = _metric_keys(rows)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["label", "size", "method", "n", "parameters"]
                        + [f"{k}_{s}" for k in keys for s in ("mean", "std")])
        for row in rows:
            values = []
            for k in keys:
                mean, std = row["metrics"].get(k, (math.nan, math.nan))
                values += [mean, std]
            writer.writerow([row["label"], row.get("size"), row.get("method"), row["n"], row["parameters"]] + values)
    return path


def markdown_table(rows: list[dict], metrics: list[str] | None = None) -> str:
    """Markdown table (mean ± std over seeds), paper Table 2/3 style."""
    keys = metrics or _metric_keys(rows)
    lines = ["| run | size | n | " + " | ".join(keys) + " |", "|---|---|---|" + "---|" * len(keys)]
    for row in rows:
        cells = [_fmt(*row["metrics"].get(k, (math.nan, math.nan))) for k in keys]
        lines.append(f"| {row['label']} | {row.get('size', '?')} | {row['n']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def size_table(rows: list[dict], length: int | None = None) -> str:
    """The paper's Table 2 across sizes: per size and method, cliff and G(C) (mean ± std over seeds), and penalty,
    ΔG(C) and the paired cliff reduction against the baseline of the same size and seed (mean ± paired SE over
    seeds where ≥ 2 seeds pair), at one evaluation length (default: the largest with a cliff)."""
    keys = _metric_keys(rows)
    lengths = sorted({int(k.split("@")[1]) for k in keys if k.startswith("cliff@")})
    if length is None and lengths:
        length = lengths[-1]
    contexts = sorted({int(k[2:-1]) for k in keys if k.startswith("G(")})
    columns = [(f"penalty@{length}", "in-dist penalty vs same-seed baseline"),
               (f"cliff@{length}", f"cliff (L={length})"),
               (f"reduction@{length}", "paired cliff reduction vs baseline (same size, seed, spans)")]
    columns += [(f"G({c})", f"G({c})") for c in contexts] + [(f"ΔG({c})", f"ΔG({c})") for c in contexts]
    columns = [c for c in columns if any(c[0] in row["metrics"] for row in rows)]
    lines = ["| size | method | n | " + " | ".join(title for _, title in columns) + " |",
             "|---|---|---|" + "---|" * len(columns)]
    for row in rows:
        cells = []
        for key, _ in columns:
            paired = row.get("paired", {}).get(key)
            if row.get("is_baseline") and key.startswith(("penalty", "ΔG", "reduction")):
                cells.append("(baseline)" if key.startswith("penalty") else "—")
            elif paired is not None and paired["seeds"]:
                cells.append(_paired_cell(key, paired, row["n"]))
            else:
                cells.append(_fmt(*row["metrics"].get(key, (math.nan, math.nan))))
        lines.append(f"| {row.get('size', '?')} | {row.get('method', row['label'])} | {row['n']} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _paired_cell(key: str, paired: dict, n: int) -> str:
    """mean (± span SE for the reduction) (± seed SE with ≥ 2 seeds) (how many seeds paired, if not all)."""
    scale, digits, suffix = (100, 1, " %") if key.startswith("penalty") else (1, 3, "")
    text = f"{paired['mean'] * scale:.{digits}f}{suffix}"
    if math.isfinite(paired["span_se"]):
        text += f" ± {paired['span_se']:.3f} span SE"
    if math.isfinite(paired["seed_se"]):
        text += f" ± {paired['seed_se'] * scale:.{digits}f}{suffix} seed SE"
    return text + (f" ({paired['seeds']} of {n} seeds paired)" if paired["seeds"] < n else "")


def _by_label(records: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        groups[r.get("label") or default_label(r["run"])].append(r)
    return groups


def _moving_average(values: list[float], width: int) -> list[float]:
    if width <= 1:
        return values
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= width:
            acc -= values[i - width]
        out.append(acc / min(i + 1, width))
    return out


def plot_loss_curves(records: list[dict], path: str | Path, *, length: int | None = None,
                     smooth: int | None = None) -> Path:
    """Per-position loss (mean over seeds) against target position, training window marked."""
    path = Path(path)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    windows, starts = set(), set()
    for label, runs in _by_label(records).items():
        lengths = sorted({int(k) for r in runs for k in r["lengths"]})
        key = str(length or lengths[-1])
        curves = [r["lengths"][key]["curve"] for r in runs if key in r["lengths"]]
        if not curves:
            continue
        mean = [statistics.fmean(v) for v in zip(*curves)]
        width = smooth or max(1, len(mean) // 100)
        ax.plot(range(1, len(mean) + 1), _moving_average(mean, width), label=f"{label} (n={len(curves)})")
        windows.add(runs[0]["train_window"])
        starts |= {(r["lengths"][key].get("cliff") or {}).get("in_start") for r in runs if key in r["lengths"]}
    for w in windows:
        ax.axvline(w, color="gray", linestyle="--", linewidth=1)
        ax.annotate(f"w={w}", (w, 1), xycoords=("data", "axes fraction"), ha="left", va="top", fontsize=8)
    if len(windows) == 1 and len(starts) == 1:  # the targets the cliff's in-distribution loss averages
        [w], [start] = windows, starts
        start = cliff_in_start(w) if start is None else start
        ax.axvspan(start, w, color="gray", alpha=0.12, linewidth=0, label=f"in-distribution ({start}–{w})")
    ax.set_xlabel("position")
    ax.set_ylabel("loss (nats)")
    ax.set_title("Per-position loss")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)  # beside the curves
    return _save(fig, path)


def plot_context_gain(records: list[dict], path: str | Path) -> Path:
    """G(C) against C (mean ± std over seeds) per label."""
    path = Path(path)
    fig, ax = plt.subplots(figsize=(6, 4))
    methods = set()
    for label, runs in _by_label(records).items():
        gains = [r["context_gain"] for r in runs if r.get("context_gain")]
        if not gains:
            continue
        methods.add(f"{gains[0]['method']}, window {gains[0]['window']}")
        cs = sorted({int(c) for g in gains for c in g["values"]})
        stats = [mean_std([g["values"].get(str(c), g["values"].get(c)) for g in gains]) for c in cs]
        ax.errorbar(cs, [m for m, _ in stats], yerr=[0 if not math.isfinite(s) else s for _, s in stats],
                    marker="o", capsize=3, label=label)
    ax.axhline(0, color="gray", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context C")
    ax.set_ylabel("G(C) (nats)")
    ax.set_title("Context gain" + (f" ({'; '.join(sorted(methods))})" if methods else ""))
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_cliff_vs_size(records: list[dict], path: str | Path, *, length: int | None = None) -> Path:
    """Cliff (mean ± std over seeds) against non-embedding parameters, one line per strategy."""
    path = Path(path)
    fig, ax = plt.subplots(figsize=(6, 4))
    series: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for label, runs in _by_label(records).items():
        key = str(length) if length else str(max(int(k) for r in runs for k in r["lengths"]))
        cliffs = [r["lengths"][key]["cliff"]["cliff"] for r in runs
                  if key in r["lengths"] and r["lengths"][key].get("cliff")]
        if cliffs and runs[0].get("parameters"):
            mean, std = mean_std(cliffs)
            series[runs[0].get("strategy") or label].append((runs[0]["parameters"], mean, std))
    for strategy, points in series.items():
        points.sort()
        ax.errorbar([p for p, _, _ in points], [m for _, m, _ in points],
                    yerr=[0 if not math.isfinite(s) else s for _, _, s in points], marker="o", capsize=3,
                    label=strategy)
    ax.set_xscale("log")
    ax.set_xlabel("non-embedding parameters")
    ax.set_ylabel("cliff (nats)")
    ax.set_title("Cliff vs model size")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
