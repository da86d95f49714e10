"""PosAug against every other trained row of a reproduction: wins, losses and ties, paired span by span.

Per seed, both models were evaluated on the same spans, so PosAug − other is paired over spans (SE over spans);
over seeds the Δs are averaged, their SEs combined (sqrt(sum se²) / n), and the seeds' spread enters as the SE of
the per-seed Δs. A win or loss must beat 2 of each (pretrain.tasks.verdict.significance); otherwise it is a tie
("no significant difference", which is not a shown equivalence).
"""

from __future__ import annotations

import math
import statistics

from pretrain.evaluation.pairing import over_seeds, pair_by_seed
from pretrain.tasks.verdict import significance

METRICS = {"cliff": "cliff", "in_dist": "in-dist loss"}


def _values(record: dict, metric: str) -> list[float]:
    spans = record["per_span"]
    if metric == "in_dist":
        return spans["in_dist"]
    return [o - i for o, i in zip(spans["ood"], spans["in_dist"])]


def versus(records: list[dict], reference: str, other: str, metric: str) -> dict | None:
    """reference − other in `metric` paired over spans per seed: {delta, se, seed_se, verdict, seeds} or None."""
    deltas, ses = [], []
    pairs = pair_by_seed([r for r in records if r["label"] in (reference, other)], lambda r: r["label"] == other)
    for record, base in sorted(pairs, key=lambda pair: pair[0]["seed"]):
        if record["label"] != reference or base is None:
            continue
        a, b = _values(record, metric), _values(base, metric)
        differences = [x - y for x, y in zip(a, b)]
        deltas.append(sum(differences) / len(differences))
        ses.append(statistics.stdev(differences) / math.sqrt(len(differences)))
    if not deltas:
        return None
    combined = over_seeds(deltas, ses)
    delta, se = combined["mean"], combined["span_se"]
    seed_se = 0.0 if math.isnan(combined["seed_se"]) else combined["seed_se"]  # one seed: no seed spread to beat
    return {"delta": delta, "se": se, "seed_se": seed_se, "verdict": significance(delta, se, seed_se),
            "seeds": len(deltas)}


def pairs(labels: list[str], reference: str = "posaug") -> list[tuple[str, str]]:
    """(reference, row) for every other trained row but the baseline (the tables compare against it), then
    (composition, its part) for each PosAug composition whose part was trained too: what PosAug adds to it."""
    out = [(reference, label) for label in labels
           if reference in labels and label not in (reference, "baseline") and "+" not in label]
    prefix = reference + "_"
    return out + [(label, label[len(prefix):]) for label in labels
                  if label.startswith(prefix) and label[len(prefix):] in labels]


def comparisons(records: list[dict], labels: list[str], reference: str = "posaug") -> list[dict]:
    """Every pair of `pairs` in each metric: {row, other, metric, delta, se, seed_se, verdict, seeds}."""
    return [{"row": row, "other": other, "metric": metric, **result}
            for row, other in pairs(labels, reference) for metric in METRICS
            if (result := versus(records, row, other, metric)) is not None]


def comparison_lines(results: list[dict]) -> list[str]:
    """One markdown line per compared pair: where the row wins, loses or ties (lower is better)."""
    lines, pairs_seen = [], list(dict.fromkeys((r["row"], r["other"]) for r in results))
    for row, other in pairs_seen:
        parts = []
        for result in (r for r in results if (r["row"], r["other"]) == (row, other)):
            word = {"lower": "wins", "higher": "loses", "no significant difference": "ties"}[result["verdict"]]
            parts.append(f"{METRICS[result['metric']]} {word} (Δ {result['delta']:+.3f} ± {result['se']:.3f} "
                         f"paired SE, seed SE {result['seed_se']:.3f}, {result['seeds']} "
                         f"seed{'s' if result['seeds'] > 1 else ''})")
        lines.append(f"- {row} vs **{other}**: " + "; ".join(parts) + ".")
    return lines
