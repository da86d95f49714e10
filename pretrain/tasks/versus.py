"""PosAug against every other row of the task suite: wins, losses and ties beyond N, paired example by example.

Per seed, every method of a task is evaluated on the same held-out examples at each length (seed 10_000 + seed),
so PosAug − other pairs per example. At one length: exact match differences d_j = [a_j exact] − [b_j exact];
per-token differences d_j = (right_a,j − right_b,j) / mean answer tokens, whose mean is exactly the difference of
the tables' per-token accuracies (answer tokens right / answer tokens). Δ at a length = mean d, SE = sd(d) / √n.
Over the unseen lengths: the mean (each length weighs the same, as in the tables), SE sqrt(Σ SE²) / #lengths. Over
seeds as the LM table (pretrain.experiments.reproduce_versus): the mean of the per-seed Δs, SE sqrt(Σ SE²) / #seeds,
and the seeds' spread as the SE of the per-seed Δs. A win or loss beats 2 of each (verdict.significance); else a
tie, which is "no significant difference", not a shown equivalence.

Records evaluated before per-example scores were stored fall back to binomial SEs combined as if independent
(conservative: the examples are shared); each result says whether it is paired.
"""

from __future__ import annotations

import math
import statistics

from pretrain.table import current_name

from .verdict import METRICS, gate, significance, token_se

REFERENCE = "posaug"
WORDS = {"higher": "wins", "lower": "loses", "no significant difference": "ties"}


def _length_difference(x: dict, y: dict, metric: str) -> tuple[float, float, bool]:
    """(x − y, its SE, paired?) at one length of two records of the same seed."""
    a, b = x.get("example_tokens"), y.get("example_tokens")
    if a and b and len(a) == len(b):
        if metric == "accuracy":
            d = [float(ra == ta) - float(rb == tb) for (ra, ta), (rb, tb) in zip(a, b)]
        else:
            answer_tokens = sum(t for _, t in a) / len(a)
            d = [(ra - rb) / answer_tokens for (ra, _), (rb, _) in zip(a, b)]
        se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else 0.0
        return sum(d) / len(d), se, True
    if metric == "accuracy":
        se = math.sqrt(x["se"] ** 2 + y["se"] ** 2)
    else:
        se = math.hypot(token_se(x["token_accuracy"], x["total"]), token_se(y["token_accuracy"], y["total"]))
    return x[metric] - y[metric], se, False


def seed_difference(a: dict, b: dict, metric: str = "accuracy") -> tuple[float, float, bool]:
    """(mean over unseen lengths of a − b, its SE, paired at every length?) for two records of one task and seed."""
    deltas, ses, paired = [], [], True
    for x, y in zip(a["lengths"], b["lengths"]):
        if x["length"] != y["length"]:
            raise ValueError(f"{a['method']} and {b['method']} were evaluated at different lengths "
                             f"({x['length']} vs {y['length']}); re-evaluate both with the same preset")
        if x["seen"]:
            continue
        delta, se, both = _length_difference(x, y, metric)
        deltas.append(delta)
        ses.append(se)
        paired = paired and both
    if not deltas:
        raise ValueError(f"{a['task']}: no unseen length to compare")
    return sum(deltas) / len(deltas), math.sqrt(sum(s * s for s in ses)) / len(ses), paired


def versus(records: list[dict], task: str, reference: str, other: str, metric: str = "accuracy") -> dict | None:
    """reference − other on `task`'s unseen lengths: {delta, se, seed_se, verdict, seeds, paired} or None."""
    by = {(current_name(r["method"]), r["seed"]): r for r in records if r["task"] == task}
    per_seed = [seed_difference(by[(reference, seed)], by[(other, seed)], metric)
                for seed in sorted(s for m, s in by if m == reference) if (other, seed) in by]
    if not per_seed:
        return None
    deltas = [d for d, _, _ in per_seed]
    delta, se = sum(deltas) / len(deltas), math.sqrt(sum(s * s for _, s, _ in per_seed)) / len(per_seed)
    seed_se = statistics.stdev(deltas) / math.sqrt(len(deltas)) if len(deltas) > 1 else 0.0
    return {"delta": delta, "se": se, "seed_se": seed_se, "verdict": significance(delta, se, seed_se),
            "seeds": len(deltas), "paired": all(p for _, _, p in per_seed)}


def versus_all(records: list[dict], summary: dict[str, dict[str, dict]], methods: list[str],
               reference: str = REFERENCE) -> dict:
    """metric → other method → task → `versus` result, over the tasks whose RoPE baseline passed the gate."""
    if reference not in methods:
        return {}
    passed = [t for t, g in gate(summary).items() if g["passed"]]
    return {metric: {other: {task: result for task in passed
                             if (result := versus(records, task, reference, other, metric)) is not None}
                     for other in methods if other != reference}
            for metric in METRICS}


def _cell(result: dict | None) -> str:
    if result is None:
        return "—"
    seeds = f", seed SE {100 * result['seed_se']:.1f}" if result["seeds"] > 1 else ""
    unpaired = "" if result["paired"] else ", unpaired"
    text = f"{100 * result['delta']:+.1f} ± {100 * result['se']:.1f}{seeds}{unpaired} {WORDS[result['verdict']]}"
    return f"**{text}**" if result["verdict"] != "no significant difference" else text


def versus_section(records: list[dict], summary: dict[str, dict[str, dict]], methods: list[str],
                   reference: str = REFERENCE, results: dict | None = None) -> str:
    """The report's section: one table per metric, a row per other method, a cell per gated task, and a tally.

    results: `versus_all`'s answer when it is already known (a merged report's stored paired results).
    """
    title = (f"## {reference} against each row, beyond N (paired per held-out example; a win or loss beats 2 "
             "paired SE and 2 seed SE)")
    if reference not in methods:
        return f"{title}\n\n{reference} was not in this run."
    if results is None:
        results = versus_all(records, summary, methods, reference)
    passed = {t for t, g in gate(summary).items() if g["passed"]}
    results = {metric: {other: {t: r for t, r in per_task.items() if t in passed}
                        for other, per_task in per_other.items() if other in methods}
               for metric, per_other in results.items()}
    tasks = sorted({t for per_metric in results.values() for per_other in per_metric.values() for t in per_other},
                   key=list(summary).index)
    if not tasks:
        return f"{title}\n\nNo task whose RoPE baseline learned it in distribution: no verdict."
    parts = [title, f"Cells: {reference} − row, in points of the metric, ± paired SE; bold where it counts."]
    for metric, name in METRICS.items():
        lines = [f"{name}:", "", "| vs | " + " | ".join(tasks) + " | wins / losses / ties |",
                 "|---|" + "---|" * (len(tasks) + 1)]
        for other, per_task in results.get(metric, {}).items():
            verdicts = [per_task[t]["verdict"] for t in tasks if t in per_task]
            tally = " / ".join(str(verdicts.count(v)) for v in WORDS)
            lines.append(f"| {other} | " + " | ".join(_cell(per_task.get(t)) for t in tasks) + f" | {tally} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)
