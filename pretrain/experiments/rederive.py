"""`python -m pretrain.experiments.rederive RESULTS.json ...`: stored verdicts under the evidence rule, no retraining.

The rule changed (pretrain.tasks.verdict.significance / equivalent): a difference must beat 2 SE of the difference
and 2 seed SE (the sd of the per-seed differences / √seeds) instead of the sum of the two rows' seed sds, and a
claimed similarity needs an equivalence test against a stated margin instead of "no significant difference". Each
re-derived verdict is set beside the verdict the file stores and the ones that differ are printed:

- ablation results.json ("conclusions"): every claim and conclusion, from the per-seed row means and the paired
  span SE stored with each claim (paired over the same spans);
- task-suite results.json ("records" of task runs): every method against the RoPE baseline on unseen lengths, in
  exact match and per-token accuracy, by pretrain.tasks.compare.difference, the function the report's ranking
  ("beats / trails RoPE") and its "Against the RoPE baseline" findings use. Its SE combines the two rows' binomial
  SEs as if independent (conservative: both rows see the same examples, but a results.json keeps no per-example
  scores to pair them). The stored verdict is the file's ranking; a file written before rankings were stored (or
  a method outside the ranking) is set against the former rule recomputed from its records, and says so. Where
  the file stores "versus_posaug" (PosAug − each row, paired per held-out example when its records had the
  per-example scores: each result says "paired"), those verdicts are re-derived from their stored Δ, paired SE
  and seed SE by verdict.significance, the function of the report's "posaug against each row" section.

Other results.json files are skipped with one line: the LM-table files (reproduce_*: per-method (mean, sd) of
loss, cliff and penalty; documents_*: the same per arm with per-span records) store no verdict for this rule to
re-derive; their reports read PosAug against each row from per-span records a results.json does not keep
(pretrain.experiments.reproduce_versus). A file that cannot be read: one line and exit status 2.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from pretrain.experiments.ablations_report import EQUIVALENCE_FRACTION, claim_verdict, overall_verdict
from pretrain.table import current_name
from pretrain.tasks.compare import difference, equivalent
from pretrain.tasks.verdict import BASELINE, METRICS, aggregate, gate, seed_se, significance
from pretrain.tasks.versus import REFERENCE


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
    """The rule before: beyond 2 SE and beyond sd_a + sd_b (for files that store no verdict of their own)."""
    return "no significant difference" if abs(delta) <= max(2 * se, spread) else ("higher" if delta > 0 else "lower")


def stored_ranking(results: dict, metric: str) -> dict[tuple[str, str], str]:
    """(method, task) → the verdict against RoPE the file's ranking stores in `metric` (empty when it stores none).

    Files written before the rename say beats_rope / trails_rope and name the baseline rope."""
    out = {}
    for entry in (results.get("ranking") or {}).get(metric) or []:
        beats = entry.get("beats_baseline", entry.get("beats_rope", []))
        trails = entry.get("trails_baseline", entry.get("trails_rope", []))
        for task in entry["tasks"]:
            out[(current_name(entry["method"]), task)] = ("higher" if task in beats else
                                                          "lower" if task in trails else "no significant difference")
    return out


def task_comparisons(results: dict) -> list[dict]:
    """Every method vs the RoPE baseline on unseen lengths of a task-suite results.json, stored and re-derived."""
    summary, out = aggregate(results["records"]), []
    passed = gate(summary)
    for metric, name in METRICS.items():
        stored = stored_ranking(results, metric)
        sd_key = "sd" if metric == "accuracy" else "token_sd"
        for task, rows in summary.items():
            base = rows.get(BASELINE)
            if base is None or not passed[task]["passed"] or base["unseen"].get(metric) is None:
                continue
            for method, row in rows.items():
                if method == BASELINE or row["unseen"] is None or row["unseen"].get(metric) is None:
                    continue
                a, b = row["unseen"], base["unseen"]
                delta, se, new = difference(a, b, metric)
                item = {"task": task, "claim": f"{method} vs {BASELINE} (unseen {name})", "new": new, "delta": delta,
                        "se": se, "se_kind": "independent binomial SE", "seed_se": seed_se(a, b, metric)}
                if (method, task) in stored:
                    item.update(old=stored[(method, task)], old_from="stored ranking")
                else:
                    spread = a.get(sd_key, 0.0) + b.get(sd_key, 0.0)
                    item.update(old=_old_significance(delta, se, spread), old_from="former rule, recomputed",
                                old_spread=spread)
                out.append(item)
    return out


def versus_comparisons(results: dict) -> list[dict]:
    """Every stored PosAug-vs-row result ("versus_posaug") re-derived from its Δ, SE and seed SE."""
    out = []
    for metric, per_other in (results.get("versus_posaug") or {}).items():
        for other, per_task in per_other.items():
            for task, result in per_task.items():
                out.append({"task": task, "claim": f"{REFERENCE} vs {other} (unseen {METRICS[metric]})",
                            "old": result["verdict"], "old_from": "stored versus_posaug",
                            "new": significance(result["delta"], result["se"], result["seed_se"]),
                            "delta": result["delta"], "se": result["se"], "seed_se": result["seed_se"],
                            "se_kind": "paired SE" if result.get("paired") else "independent binomial SE"})
    return out


def paired_disagreements(task_items: list[dict], versus_items: list[dict]) -> list[str]:
    """PosAug vs RoPE where the paired verdict (versus_posaug) and the independent-SE one (the ranking) differ."""
    independent = {(i["task"], i["claim"]): i for i in task_items}
    lines = []
    for item in versus_items:
        other = independent.get((item["task"], item["claim"]))
        if other is not None and item["se_kind"] == "paired SE" and other["new"] != item["new"]:
            lines.append(f"  note: {item['task']} — {item['claim']}: {item['new']} with the paired SE "
                         f"{item['se']:.4f}, {other['new']} with independent binomial SEs {other['se']:.4f} "
                         f"(seed SE {item['seed_se']:.4f}); the report's ranking uses the latter, its PosAug "
                         "section the former")
    return lines


def kind(results: object) -> str | None:
    """'ablation' | 'tasks' | None (a file that holds no verdict this rule re-derives)."""
    if not isinstance(results, dict):
        return None
    if isinstance(results.get("conclusions"), dict) and isinstance(results.get("summary"), dict):
        return "ablation"
    records = results.get("records")
    if isinstance(records, list) and records and all(isinstance(r, dict) and "task" in r for r in records):
        return "tasks"
    return None


def _sources(items: list[dict]) -> str:
    """What the re-derived verdicts are set against: 'stored ranking', 'former rule, recomputed', ..."""
    return " / ".join(sorted({i.get("old_from", "stored verdict") for i in items}))


def _line(item: dict) -> str:
    where = f"Table {item['table']}: {item['conclusion']}" if "table" in item else item["task"]
    numbers = ""
    if "delta" in item:
        numbers = (f" (Δ {item['delta']:+.4f}, {item.get('se_kind', 'paired SE')} {item['se']:.4f}"
                   + (f", seed SE {item['seed_se']:.4f}" if item.get("seed_se") is not None else "")
                   + (f", old spread {item['old_spread']:.4f}" if item.get("old_spread") is not None else "")
                   + (f", margin ±{item['margin']:.4f}" if item.get("margin") is not None else "") + ")")
    source = f" [{item['old_from']}]" if "old_from" in item else ""
    return f"  {where} — {item['claim']}: {item['old']}{source} → {item['new']}{numbers}"


def main(argv: list[str]) -> int:
    """Print each stored results file's verdicts that the evidence rule changes; 2 when a file cannot be read."""
    if not argv:
        print("usage: python -m pretrain.experiments.rederive RESULTS.json [...]", file=sys.stderr)
        return 2
    status = 0
    for name in argv:
        try:
            results = json.loads(Path(name).read_text())
        except (OSError, ValueError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else error
            print(f"error: {name}: {reason} (pass an ablation or task-suite results.json)", file=sys.stderr)
            status = 2
            continue
        what = kind(results)
        if what is None:
            print(f"{name}: skipped — neither an ablation nor a task-suite results.json (no verdict to re-derive)")
            continue
        notes = []
        if what == "ablation":
            groups = [("claims and conclusions (paired span SE)", ablation_claims(results))]
        else:
            versus_items = versus_comparisons(results)
            unpaired = sum(i["se_kind"] != "paired SE" for i in versus_items)
            groups = [("method vs RoPE (independent binomial SEs)", task_comparisons(results)),
                      ("PosAug vs each row (paired SE" + (f"; {unpaired} unpaired: independent binomial SEs"
                                                         if unpaired else "") + ")", versus_items)]
            notes = paired_disagreements(groups[0][1], versus_items)
        groups = [(label, items) for label, items in groups if items]
        changed = [i for _, items in groups for i in items if i["old"] != i["new"]]
        total = sum(len(items) for _, items in groups)
        parts = "; ".join(f"{label} against the {_sources(items)}: {sum(i['old'] != i['new'] for i in items)} "
                          f"of {len(items)}" for label, items in groups)
        print(f"{name}: {len(changed)} of {total} verdicts change ({parts})")
        for item in changed:
            print(_line(item))
        for note in notes:
            print(note)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
