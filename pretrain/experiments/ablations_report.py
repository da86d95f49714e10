"""The ablation suite's report: each table beside the paper's numbers, each stated conclusion checked.

Per (row, seed) the evaluation records per-span losses; every number here is a function of them.
A row's metric is its mean over spans, then over seeds (± seed sd). A comparison of two rows is
paired span by span within a seed (same tokens), its SE taken over spans, then combined over seeds
(sqrt(sum se²) / n); it counts as a difference under the task suite's rule
(`pretrain.tasks.compare.significance`): beyond 2 paired SE and beyond 2 seed SE (the sd of the per-seed
differences / √seeds). A claimed similarity is reproduced only by an equivalence test (two one-sided
tests, `pretrain.tasks.compare.equivalent`) against the margin EQUIVALENCE_FRACTION × |PosAug − baseline|
in the same metric: more noise can no longer make "similar" come true.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from pretrain.experiments.ablation_tables import ROWS, TABLES, Claim, Conclusion, row_preset, rows_of
from pretrain.experiments.presets import Preset
from pretrain.tasks.compare import equivalent, significance
from pretrain.trainer.run_pool import machines_text

METRICS = {"cliff_4w": "cliff at 4w", "cliff_8w": "cliff at 8w", "gain": "G(4w)", "in_dist": "in-dist loss"}
OPPOSITE = {"lower": "higher", "higher": "lower"}
# "similar" means within this fraction of the PosAug − baseline effect in the same metric (two one-sided tests).
EQUIVALENCE_FRACTION = 0.25


def span_values(record: dict, metric: str) -> list[float] | None:
    """Per-span values of `metric` (cliff_4w, cliff_8w, gain, in_dist) of one evaluation record."""
    spans = record["per_span"]
    if metric == "in_dist":
        return spans["in_dist"]
    if metric == "gain":
        return spans.get("gain_4w")
    ood = spans["ood_4w" if metric == "cliff_4w" else "ood_8w"]
    return [o - i for o, i in zip(ood, spans["in_dist"])]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _se(values: list[float]) -> float:
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _by_row(records: list[dict]) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {}
    for record in records:
        out.setdefault(record["row"], {})[record["seed"]] = record
    return out


def summarise(records: list[dict]) -> dict[str, dict]:
    """row → per metric {mean, se (spans), sd (seeds), per_seed}, and Δ in-dist / penalty vs the same seed's baseline."""
    rows = _by_row(records)
    base = rows.get("baseline", {})
    summary = {}
    for name, seeds in rows.items():
        entry: dict = {"seeds": sorted(seeds)}
        for metric in METRICS:
            per_seed = {s: v for s, r in seeds.items() if (v := span_values(r, metric)) is not None}
            if not per_seed:
                continue
            means = [_mean(v) for v in per_seed.values()]
            entry[metric] = {"mean": _mean(means), "sd": _sd(means),
                             "se": math.sqrt(sum(_se(v) ** 2 for v in per_seed.values())) / len(per_seed),
                             "per_seed": {s: _mean(v) for s, v in per_seed.items()}}
        common = [s for s in seeds if s in base]
        if common and name != "baseline":
            delta = compare(records, name, "baseline", "in_dist")
            base_in = _mean([_mean(base[s]["per_span"]["in_dist"]) for s in common])
            entry["delta"] = delta
            entry["penalty"] = delta["delta"] / base_in
        summary[name] = entry
    return summary


def compare(records: list[dict], row: str, other: str, metric: str) -> dict | None:
    """row − other in `metric`, paired span by span per seed: {delta, se, spread, verdict, seeds} or None."""
    rows = _by_row(records)
    seeds = sorted(set(rows.get(row, {})) & set(rows.get(other, {})))
    deltas, ses, a_means, b_means = [], [], [], []
    for seed in seeds:
        a, b = span_values(rows[row][seed], metric), span_values(rows[other][seed], metric)
        if a is None or b is None:
            continue
        if len(a) != len(b):
            raise ValueError(f"{row} and {other} (seed {seed}) were evaluated on different spans "
                             f"({len(a)} vs {len(b)}): evaluate both on the same preset")
        differences = [x - y for x, y in zip(a, b)]
        deltas.append(_mean(differences))
        ses.append(_se(differences))
        a_means.append(_mean(a))
        b_means.append(_mean(b))
    if not deltas:
        return None
    delta = _mean(deltas)
    se = math.sqrt(sum(s ** 2 for s in ses)) / len(ses)
    seed_se = _sd(deltas) / math.sqrt(len(deltas))  # the seeds' spread of the paired Δ, as an SE (0: one seed)
    return {"delta": delta, "se": se, "seed_se": seed_se, "verdict": significance(delta, se, seed_se),
            "seeds": len(deltas)}


def equivalence_margin(records: list[dict], metric: str) -> float | None:
    """EQUIVALENCE_FRACTION × |PosAug − baseline| in `metric` (paired), or None when either is not measured."""
    reference = compare(records, "posaug", "baseline", metric)
    return None if reference is None else EQUIVALENCE_FRACTION * abs(reference["delta"])


def claim_verdict(expected: str, measured: str, equivalent_within_margin: bool = False) -> str:
    """'reproduced' | 'opposite' | 'no significant difference' | 'inconclusive' of one comparison.

    A claimed difference is reproduced when the measured one is significant in its direction and
    opposite when significant the other way. A claimed similarity ('similar') is reproduced only when the
    equivalence test passes (`equivalent_within_margin`), opposite when a significant difference is measured,
    and otherwise inconclusive: no difference measured is not evidence of none. A claimed 'no better'
    ('not_lower' / 'not_higher') is reproduced unless the measured difference is significant the excluded way.
    """
    if expected == "similar":
        if measured != "no significant difference":
            return "opposite"
        return "reproduced" if equivalent_within_margin else "inconclusive"
    if expected.startswith("not_"):  # "no better than": only a significant difference the excluded way contradicts
        return "opposite" if measured == expected[4:] else "reproduced"
    if measured == expected:
        return "reproduced"
    return "opposite" if measured == OPPOSITE[expected] else "no significant difference"


def overall_verdict(verdicts: list[str]) -> str:
    """A conclusion's verdict from its claims': not measured > opposite > all reproduced > inconclusive > none."""
    if "not measured" in verdicts:
        return "not measured"
    if "opposite" in verdicts:
        return "opposite"
    if all(v == "reproduced" for v in verdicts):
        return "reproduced"
    return "inconclusive" if "inconclusive" in verdicts else "no significant difference"


def check(conclusion: Conclusion, records: list[dict], eval_factor: int, paper: dict | None = None) -> dict:
    """One conclusion against the records: per claim the paired comparison and its verdict, and overall.

    Overall: reproduced when every claim is, opposite when any claim is, else no significant difference;
    'not measured' when a claim's rows (or G) are missing. With the table's published numbers (`paper`),
    each claim also carries the paper's own difference, and a cliff claim our PosAug − baseline cliff
    difference (the scale on which a reader judges a small significant difference).
    """
    paper = paper or {}
    parts = []
    for claim in conclusion.claims:
        metric = f"cliff_{eval_factor}w" if claim.metric == "cliff" else claim.metric
        result = compare(records, claim.row, claim.other, metric)
        margin = equivalence_margin(records, metric) if claim.expected == "similar" else None
        if result is None or (claim.expected == "similar" and margin is None):
            verdict = "not measured"
        else:
            within = margin is not None and equivalent(result["delta"], result["se"], result["seed_se"], margin)
            verdict = claim_verdict(claim.expected, result["verdict"], within)
        part = {"claim": claim, "metric": metric, "result": result, "verdict": verdict}
        if margin is not None:
            part["margin"] = margin
        theirs = [paper.get(r, {}).get(claim.metric) for r in (claim.row, claim.other)]
        if None not in theirs:
            part["paper_delta"] = theirs[0] - theirs[1]
        reference = compare(records, "posaug", "baseline", metric) if claim.metric == "cliff" else None
        if result is not None and reference is not None and {claim.row, claim.other} != {"posaug", "baseline"}:
            part["posaug_minus_baseline"] = reference["delta"]
        parts.append(part)
    return {"text": conclusion.text, "verdict": overall_verdict([p["verdict"] for p in parts]), "parts": parts}


def _num(entry: dict | None, digits: int = 3, sign: bool = False) -> str:
    if entry is None:
        return "—"
    text = f"{entry['mean']:+.{digits}f}" if sign else f"{entry['mean']:.{digits}f}"
    se = f" ± {entry['se']:.{digits}f}" if math.isfinite(entry["se"]) else ""
    sd = f" (sd {entry['sd']:.{digits}f})" if len(entry.get("per_seed", {})) > 1 else ""
    return text + se + sd


def _paper(value: float | None, sign: bool = False, percent: bool = False, digits: int = 2) -> str:
    """A published number at the paper's precision (Table 5: three decimals, the others two)."""
    if value is None:
        return "—"
    if percent:
        return f"{100 * value:.1f} %"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def _claim_text(part: dict) -> str:
    claim: Claim = part["claim"]
    want = {"lower": "<", "higher": ">", "similar": "≈", "not_lower": "≥", "not_higher": "≤"}[claim.expected]
    head = f"{claim.row} {want} {claim.other} in {METRICS[part['metric']]}"
    result = part["result"]
    if result is None:
        return f"{head}: not measured"
    spread = f", seed SE {result['seed_se']:.3f}" if result["seeds"] > 1 else ""
    if "margin" in part:
        spread += f", equivalence margin ±{part['margin']:.3f}"
    share = f"; PosAug − baseline {part['posaug_minus_baseline']:+.3f}" if "posaug_minus_baseline" in part else ""
    theirs = ""
    if "paper_delta" in part:
        delta = part["paper_delta"]
        theirs = f"; paper Δ {delta:+.2f}" if abs(delta) >= 0.05 else f"; paper Δ {delta:+.3f}"
    return (f"{head}: Δ {result['delta']:+.3f} ± {result['se']:.3f} paired SE{spread} "
            f"({result['seeds']} seed{'s' if result['seeds'] > 1 else ''}){share}{theirs} → {part['verdict']}")


def table_section(number: int, summary: dict, records: list[dict]) -> tuple[str, list[dict]]:
    """The markdown of one table (ours beside the paper's) and its checked conclusions."""
    table = TABLES[number]
    cliff, other = f"cliff_{table.eval_factor}w", f"cliff_{12 - table.eval_factor}w"
    paper_k = "the paper's 16K" if table.eval_factor == 8 else "the paper's 8K"
    header = ["Row", "n", f"Paper cliff ({paper_k})", f"Cliff at {table.eval_factor}w ± SE", f"Cliff at "
              f"{12 - table.eval_factor}w", "Paper G(8K)", "G(4w) ± SE", "Paper in-dist", "In-dist ± SE",
              "Paper Δ" if number != 5 else "Paper penalty", "Δ in-dist vs baseline ± paired SE (penalty)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    digits = 3 if number == 5 else 2
    for name in table.rows:
        paper = table.paper[name]
        s = summary.get(name)
        if s is None:
            lines.append(f"| {ROWS[name].label} | 0 | {_paper(paper.get('cliff'), digits=digits)} | not run yet "
                         "| | | | | | | |")
            continue
        delta = s.get("delta")
        ours_delta = "—" if delta is None else (f"{delta['delta']:+.3f} ± {delta['se']:.3f} "
                                                f"({100 * s['penalty']:+.1f} %)")
        paper_delta = (_paper(paper.get("penalty"), percent=True) if number == 5
                       else _paper(paper.get("delta"), sign=True))
        lines.append(f"| {ROWS[name].label} | {len(s['seeds'])} | {_paper(paper.get('cliff'), digits=digits)} | "
                     f"{_num(s.get(cliff))} | {_num(s.get(other))} | {_paper(paper.get('gain'), sign=True)} | "
                     f"{_num(s.get('gain'), sign=True)} | {_paper(paper.get('in_dist'), digits=digits)} | "
                     f"{_num(s.get('in_dist'))} | "
                     f"{paper_delta} | {ours_delta} |")
    checked = [check(c, records, table.eval_factor, table.paper) for c in table.conclusions]
    findings = [f"- **{c['verdict']}** — {c['text']}:\n" + "\n".join(f"  - {_claim_text(p)}" for p in c["parts"])
                for c in checked]
    text = f"## Table {number}: {table.title}\n\n" + "\n".join(lines) + "\n\nThe paper's conclusions:\n\n" + \
        "\n".join(findings)
    return text, checked


def _plot(summary: dict, records: list[dict], tables: list[int], path: Path) -> Path | None:
    """Cliff (at each table's evaluation length) against in-distribution Δ, one panel per table.

    Error bars are paired SEs against the same seeds' baseline (the comparisons the verdicts use), not the
    larger unpaired SEs of the values themselves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [n for n in tables if any(r in summary for r in TABLES[n].rows)]
    if not shown:
        return None
    columns = min(4, len(shown))
    rows = math.ceil(len(shown) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.6 * rows), squeeze=False)
    for ax, number in zip(axes.flat, shown):
        table = TABLES[number]
        cliff = f"cliff_{table.eval_factor}w"
        for name in table.rows:
            s = summary.get(name)
            if s is None or cliff not in s:
                continue
            x = s["delta"]["delta"] if "delta" in s else 0.0
            xerr = s["delta"]["se"] if "delta" in s else 0.0
            paired = compare(records, name, "baseline", cliff) if name != "baseline" else None
            y, yerr = s[cliff]["mean"], paired["se"] if paired else 0.0
            ax.errorbar([x], [y], xerr=[xerr], yerr=[0 if not math.isfinite(yerr) else yerr], fmt="o", capsize=3)
            ax.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_title(f"Table {number}", fontsize=9)
        ax.set_xlabel("Δ in-dist loss vs baseline (nats)", fontsize=8)
        ax.set_ylabel(f"cliff at {table.eval_factor}w (nats)", fontsize=8)
        ax.axvline(0, color="grey", lw=0.5)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cost(timing: dict, records: list[dict]) -> str:
    invocations = timing.get("invocations", [])
    evaluation = sum(r.get("eval_s", 0.0) for r in records)
    wall = sum(i["wall_s"] for i in invocations)
    loads = ", ".join(f"{i['load_start']}→{i['load_end']}" for i in invocations) or "not recorded"
    return (f"Cost: {timing['runs_timed']} runs trained, {timing['train_cpu_s'] / 60:.0f} CPU-min of training "
            f"({timing['train_wall_s'] / 60:.0f} min of summed run wall time) on {timing['cores']} cores; "
            f"{evaluation / 60:.0f} min of evaluation wall time for {len(records)} runs; "
            f"{len(invocations)} invocation(s), {wall / 60:.0f} min wall in all (evaluation included); "
            f"1-min load average at start→end of each invocation: {loads}{machines_text(invocations)}.")


def write_report(out: Path, preset_name: str, preset: Preset, tables: list[int], records: list[dict],
                 timing: dict, planned: dict) -> Path:
    """report.md, results.json and cliff_vs_penalty.png under `out`; returns the report path."""
    summary = summarise(records)
    seeds = sorted({r["seed"] for r in records})
    wanted = {(name, seed) for name in rows_of(planned["tables"]) for seed in planned["seeds"]}
    have = {(r["row"], r["seed"]) for r in records}
    partial = len(wanted - have)
    sections, checked = [], {}
    for number in tables:
        text, checked[number] = table_section(number, summary, records)
        sections.append(text)
    verdicts = [c["verdict"] for cs in checked.values() for c in cs]
    tally = ", ".join(f"{verdicts.count(v)} {v}" for v in ("reproduced", "opposite", "no significant difference",
                                                          "inconclusive", "not measured") if verdicts.count(v))
    plot = _plot(summary, records, tables, out / "cliff_vs_penalty.png")
    w = preset.window
    steps = {name: row_preset(preset, ROWS[name]).train_iters for name in ("baseline", "baseline_2w", "baseline_4w")}
    status = (f"**Partial: {partial} of {len(wanted)} planned (row, seed) runs are not evaluated yet** "
              f"(planned seeds {planned['seeds']}, tables {planned['tables']}).\n\n" if partial else "")
    text = f"""# Ablation report (paper §4.5–4.11, Tables 5–11) — preset `{preset_name}`

{status}Model `{preset.model}` (Table 9's deep/wide shapes scaled from it), training window w = {w},
{preset.train_tokens:,} training tokens per run ({steps['baseline']} steps of {preset.global_batch_size} × {w};
Table 11's 2w / 4w windows: {steps['baseline_2w']} / {steps['baseline_4w']} steps at the same tokens), seeds {seeds},
same data order and initial weights for every row of a seed. Evaluation: {preset.num_spans} contiguous spans of
{preset.eval_length} tokens (8w), identical for all runs, one full-context pass each with standard RoPE positions.
In-dist = mean loss at targets {preset.in_dist_start}–{w}; cliff at kw = mean loss at targets w+1 … kw minus in-dist
(the paper's 8K is 4w and its 16K 8w at w = 2048; Table 11's longer-window rows are split at the same w, so all
its rows measure the same targets). G(4w) = mean loss seeing exactly the {preset.gain_window} preceding tokens
minus the full-context loss, over targets {preset.gain_window}…4w of the first {preset.gain_spans} spans (the
paper's 512-token window is w/4). Δ = in-dist minus the same seed's baseline (paired over spans).

Numbers: mean over seeds ± SE over spans (seed sd in brackets with more than one seed). A conclusion holds
("reproduced") when every comparison it rests on is significant in the paper's direction — beyond 2 paired SE
and beyond 2 seed SE (the sd of the per-seed paired Δ / √seeds), the task suite's rule — or, for a claimed
similarity, passes an equivalence test (two one-sided tests at 5 %: Δ ± 1.645·max(paired SE, seed SE) inside
±{EQUIVALENCE_FRACTION:g} × |PosAug − baseline| in the same metric); "opposite" when a comparison is significant
the other way (or a claimed similarity shows a significant difference); "inconclusive" when a similarity is
neither shown nor refuted; otherwise "no significant difference". Verdicts: {tally}.

The paper's cliffs differ between tables (its Tables 6–8 and 5 come from different ablation rounds, §4.5): compare
our rows within a table, and the paper's rows within a table, not our values with its values.

{chr(10).join(chr(10) + s for s in sections)}

{f"![cliff vs in-distribution Δ per table]({plot.name})" if plot else ""}
{"(error bars: paired SE against the same seed's baseline)" if plot else ""}

{_cost(timing, records)}
"""
    (out / "report.md").write_text(text)
    results = {"preset": preset_name, "preset_fields": {k: getattr(preset, k) for k in (
        "model", "window", "train_tokens", "global_batch_size", "lr", "eval_length", "num_spans", "in_dist_start",
        "gain_window", "gain_spans")}, "seeds": seeds, "planned": planned, "partial_missing": partial,
        "summary": summary, "timing": timing,
        "conclusions": {str(n): [{"text": c["text"], "verdict": c["verdict"], "parts": [
            {**(p["result"] or {}), "measured": (p["result"] or {}).get("verdict"),
             "row": p["claim"].row, "other": p["claim"].other, "metric": p["metric"], "expected": p["claim"].expected,
             "verdict": p["verdict"], "paper_delta": p.get("paper_delta"),
             "posaug_minus_baseline": p.get("posaug_minus_baseline"), "margin": p.get("margin")}
            for p in c["parts"]]} for c in cs]
            for n, cs in checked.items()}}
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    return out / "report.md"
