"""`python -m pretrain.experiments.rederive RESULTS.json ...`: stored verdicts under the evidence rule, no retraining.

The rule changed (pretrain.tasks.verdict.significance / equivalent): a difference must beat 2 paired SE and 2 seed
SE (the sd of the per-seed differences / √seeds) instead of the sum of the two rows' seed sds, and a claimed
similarity needs an equivalence test against a stated margin instead of "no significant difference". This reads
an ablation results.json (per-seed row means and the paired span SE of every claim) or a task-suite results.json
(every per-length record), re-derives each verdict and prints the ones that changed beside the stored ones.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from pretrain.experiments.ablations_report import EQUIVALENCE_FRACTION, claim_verdict, overall_verdict
from pretrain.tasks.compare import difference, equivalent, significance
from pretrain.tasks.verdict import BASELINE, aggregate, gate, seed_se


def _per_seed_deltas(summary: dict, row: str, other: str, metric: str) -> list[float]:
    a, b = summary[row][metric]["per_seed"], summary[other][metric]["per_seed"]
    return [a[s] - b[s] for s in a if s in b]


def _seed_se(deltas: list[float]) -> float:
    return statistics.stdev(deltas) / math.sqrt(len(deltas)) if len(deltas) > 1 else 0.0


def ablation_claims(results: dict) -> list[dict]:
    """Every claim of an ablation results.json: stored verdict, re-derived verdict, and the numbers behind it."""
    summary, out = results["summary"], []
    for table, conclusions in results["conclusions"].items():
        for conclusion in conclusions:
            verdicts = []
            for part in conclusion["parts"]:
                row, other, metric = part["row"], part["other"], part["metric"]
                if "delta" not in part or metric not in summary.get(row, {}) or metric not in summary.get(other, {}):
                    verdicts.append(part["verdict"])
                    continue
                # Files written before the claim verdict had its own key hold the measured direction in "verdict".
                stored_measured = part.get("measured", part["verdict"])
                old_claim = (("reproduced" if stored_measured == "no significant difference" else "opposite")
                             if part["expected"] == "similar" else claim_verdict(part["expected"], stored_measured))
                seed_se = _seed_se(_per_seed_deltas(summary, row, other, metric))
                measured = significance(part["delta"], part["se"], seed_se)
                margin = None
                if part["expected"] == "similar" and metric in summary.get("posaug", {}):
                    reference = _per_seed_deltas(summary, "posaug", "baseline", metric)
                    margin = EQUIVALENCE_FRACTION * abs(sum(reference) / len(reference))
                within = margin is not None and equivalent(part["delta"], part["se"], seed_se, margin)
                verdict = claim_verdict(part["expected"], measured, within)
                verdicts.append(verdict)
                out.append({"table": table, "conclusion": conclusion["text"], "claim": f"{row} {part['expected']} "
                            f"{other} in {metric}", "old": old_claim, "new": verdict, "delta": part["delta"],
                            "se": part["se"], "seed_se": seed_se, "old_spread": part.get("spread"), "margin": margin})
            out.append({"table": table, "conclusion": conclusion["text"], "claim": "(overall)",
                        "old": conclusion["verdict"], "new": overall_verdict(verdicts)})
    return out


def _old_significance(delta: float, se: float, spread: float) -> str:
    """The rule before: beyond 2 SE and beyond sd_a + sd_b (kept here only to say what changed)."""
    return "no significant difference" if abs(delta) <= max(2 * se, spread) else ("higher" if delta > 0 else "lower")


def task_comparisons(results: dict) -> list[dict]:
    """Every method vs the RoPE baseline on unseen lengths of a task-suite results.json, old and new rule."""
    summary, out = aggregate(results["records"]), []
    passed = gate(summary)
    for task, rows in summary.items():
        base = rows.get(BASELINE)
        if base is None or not passed[task]["passed"]:
            continue
        for method, row in rows.items():
            if method == BASELINE or row["unseen"] is None:
                continue
            a, b = row["unseen"], base["unseen"]
            delta, se, new = difference(a, b)
            old = _old_significance(delta, se, a.get("sd", 0.0) + b.get("sd", 0.0))
            out.append({"task": task, "claim": f"{method} vs {BASELINE} (unseen exact match)", "old": old, "new": new,
                        "delta": delta, "se": se, "seed_se": seed_se(a, b),
                        "old_spread": a.get("sd", 0.0) + b.get("sd", 0.0)})
    return out


def main(argv: list[str]) -> int:
    """Print each stored results file's verdicts that the evidence rule changes."""
    if not argv:
        print("usage: python -m pretrain.experiments.rederive RESULTS.json [...]", file=sys.stderr)
        return 2
    for name in argv:
        try:
            results = json.loads(Path(name).read_text())
        except (OSError, ValueError) as error:
            print(f"error: {name}: {error} (pass an ablation or task-suite results.json)", file=sys.stderr)
            return 2
        items = ablation_claims(results) if "conclusions" in results else task_comparisons(results)
        changed = [i for i in items if i["old"] != i["new"]]
        print(f"{name}: {len(changed)} of {len(items)} verdicts change")
        for item in changed:
            where = f"Table {item['table']}: {item['conclusion']}" if "table" in item else item["task"]
            numbers = (f" (Δ {item['delta']:+.4f}, paired SE {item['se']:.4f}"
                       + (f", seed SE {item['seed_se']:.4f}" if item.get("seed_se") is not None else "")
                       + (f", old spread {item['old_spread']:.4f}" if item.get("old_spread") is not None else "")
                       + (f", margin ±{item['margin']:.4f}" if item.get("margin") is not None else "") + ")"
                       if "delta" in item else "")
            print(f"  {where} — {item['claim']}: {item['old']} → {item['new']}{numbers}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
