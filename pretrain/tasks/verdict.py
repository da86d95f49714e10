"""From per-run records to verdicts: seeds aggregated, the learnability gate, spread-aware wins, rankings.

A task's unseen-length numbers test length generalisation only if the RoPE baseline learned the
task in distribution, so a task whose baseline misses the gate (mean exact match on seen lengths
over seeds < GATE) gets no verdict and no place in any ranking. A method "wins" over another only
where its advantage exceeds 2 binomial SEs of the difference and 2 seed SEs of the per-seed
differences (pretrain.tasks.compare.significance).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from pretrain.table import current_name

BASELINE = "baseline"  # the RoPE baseline (pretrain.table's name; stored records say "rope": table.current_name)
GATE = 0.95  # RoPE exact match on seen lengths, mean over seeds
METRICS = {"accuracy": "exact match", "token_accuracy": "per-token accuracy"}


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def token_se(token_accuracy: float, count: int) -> float:
    """A conservative binomial-style SE of a per-token accuracy over `count` examples."""
    # An example's token accuracy lies in [0, 1], so its variance is at most p(1 - p): a conservative SE.
    return math.sqrt(max(token_accuracy * (1 - token_accuracy), 0.0) / count)


def _part(records: list[dict], part: str) -> dict | None:
    """Mean over seeds of one part (seen / unseen): exact match and per-token, ± seed sd and binomial SE."""
    parts = [(r["seed"], r["summary"][part], [x for x in r["lengths"] if x["seen"] == (part == "seen")])
             for r in records]
    if parts[0][1] is None:
        return None
    per_seed = []
    for seed, summary, lengths in parts:
        token = (sum(x["token_accuracy"] for x in lengths) / len(lengths)
                 if lengths and all("token_accuracy" in x for x in lengths) else None)
        token_spread = (math.sqrt(sum(token_se(x["token_accuracy"], x["total"]) ** 2 for x in lengths)) / len(lengths)
                        if token is not None else None)
        per_seed.append({"seed": seed, "accuracy": summary["accuracy"], "se": summary["se"],
                         "token_accuracy": token, "token_se": token_spread})
    n = len(per_seed)
    out = {"accuracy": sum(p["accuracy"] for p in per_seed) / n,
           # independent seeds: the binomial SE of their mean is sqrt(sum se^2) / n
           "se": math.sqrt(sum(p["se"] ** 2 for p in per_seed)) / n,
           "sd": _sd([p["accuracy"] for p in per_seed]), "per_seed": per_seed}
    if all(p["token_accuracy"] is not None for p in per_seed):
        out.update(token_accuracy=sum(p["token_accuracy"] for p in per_seed) / n,
                   token_se=math.sqrt(sum(p["token_se"] ** 2 for p in per_seed)) / n,
                   token_sd=_sd([p["token_accuracy"] for p in per_seed]))
    return out


def aggregate(records: list[dict]) -> dict[str, dict[str, dict]]:
    """task → method → per-length means over seeds (± sd) and seen / unseen summaries (see `_part`)."""
    grouped: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for record in records:
        grouped[(record["task"], current_name(record["method"]))].append(record)
    out: dict[str, dict[str, dict]] = defaultdict(dict)
    for (task, method), group in grouped.items():
        group.sort(key=lambda r: r["seed"])
        lengths = [x["length"] for x in group[0]["lengths"]]
        by_length = [[r["lengths"][i] for r in group] for i in range(len(lengths))]
        row = {"lengths": lengths, "train_lengths": group[0]["train_lengths"], "seeds": [r["seed"] for r in group],
               "accuracy": [sum(x["accuracy"] for x in xs) / len(xs) for xs in by_length],
               "accuracy_sd": [_sd([x["accuracy"] for x in xs]) for xs in by_length]}
        if all("token_accuracy" in x for xs in by_length for x in xs):
            row["token_accuracy"] = [sum(x["token_accuracy"] for x in xs) / len(xs) for xs in by_length]
        for part in ("seen", "unseen"):
            row[part] = _part(group, part)
        out[task][method] = row
    return dict(out)


def gate(summary: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """Per task: did the RoPE baseline learn it in distribution ({'passed', 'seen', 'per_seed'})?"""
    out = {}
    for task, rows in summary.items():
        base = rows.get(BASELINE)
        if base is None or base["seen"] is None:
            out[task] = {"passed": False, "seen": None, "per_seed": [], "why": "no RoPE baseline in this run"}
            continue
        seen = base["seen"]["accuracy"]
        out[task] = {"passed": seen >= GATE, "seen": seen,
                     "per_seed": [p["accuracy"] for p in base["seen"].get("per_seed", [])],
                     "why": f"{BASELINE} seen exact match {100 * seen:.1f} % "
                            + ("≥" if seen >= GATE else "<") + f" {100 * GATE:.0f} %"}
    return out


Z = 2.0  # a difference counts beyond Z standard errors (paired/binomial, and over seeds)
TOST_Z = 1.645  # two one-sided tests at 5 % each: the 90 % interval must lie inside ±margin


def seed_se(a: dict, b: dict, metric: str = "accuracy") -> float:
    """SE over seeds of the per-seed differences a − b (paired by seed); 0 with fewer than 2 common seeds.

    Summaries without per-seed values (compare.all_lengths) give sd and n_seeds: then sqrt(sd_a² + sd_b²) / √n."""
    if "per_seed" not in a or "per_seed" not in b:
        n = min(a.get("n_seeds", 1), b.get("n_seeds", 1))
        sd_key = "sd" if metric == "accuracy" else "token_sd"
        return math.sqrt(a.get(sd_key, 0.0) ** 2 + b.get(sd_key, 0.0) ** 2) / math.sqrt(n) if n > 1 else 0.0
    per_a = {p["seed"]: p.get(metric) for p in a.get("per_seed", [])}
    per_b = {p["seed"]: p.get(metric) for p in b.get("per_seed", [])}
    deltas = [per_a[s] - per_b[s] for s in per_a if s in per_b and per_a[s] is not None and per_b[s] is not None]
    return statistics.stdev(deltas) / math.sqrt(len(deltas)) if len(deltas) > 1 else 0.0


def significance(delta: float, se: float, seed_spread_se: float = 0.0) -> str:
    """'higher' | 'lower' | 'no significant difference': a difference counts beyond Z·SE and beyond Z·(seed SE).

    `seed_spread_se` is the seeds' spread as a standard error of the difference (0 with one seed)."""
    if not math.isfinite(se):
        se = 0.0
    threshold = Z * max(se, seed_spread_se)
    return "no significant difference" if abs(delta) <= threshold else ("higher" if delta > 0 else "lower")


def equivalent(delta: float, se: float, seed_spread_se: float, margin: float) -> bool:
    """Two one-sided tests: is |a − b| < margin at 5 % each side (Δ ± 1.645·max(SE, seed SE) inside ±margin)?"""
    if not (margin > 0 and math.isfinite(margin)):
        return False
    uncertainty = max(se if math.isfinite(se) else 0.0, seed_spread_se)
    return abs(delta) + TOST_Z * uncertainty < margin


def exceeds(a: dict, b: dict, metric: str = "accuracy") -> bool:
    """Is a's advantage over b (in `metric`) larger than 2 binomial SEs and 2 seed SEs (`significance`)?"""
    se_key = "se" if metric == "accuracy" else "token_se"
    if a.get(metric) is None or b.get(metric) is None:
        return False
    delta, se = a[metric] - b[metric], math.sqrt(a[se_key] ** 2 + b[se_key] ** 2)
    return significance(delta, se, seed_se(a, b, metric)) == "higher"


def best(rows: dict[str, dict], methods: list[str], part: str = "unseen", metric: str = "accuracy") -> str | None:
    """The method to bold in a row: the highest mean, if its lead over the runner-up exceeds the spread."""
    scored = sorted((rows[m][part][metric], m) for m in methods
                    if m in rows and rows[m][part] is not None and rows[m][part].get(metric) is not None)
    if len(scored) < 2:
        return None
    top, second = rows[scored[-1][1]][part], rows[scored[-2][1]][part]
    return scored[-1][1] if exceeds(top, second, metric) else None


def ranking(summary: dict[str, dict[str, dict]], methods: list[str], metric: str = "accuracy") -> list[dict]:
    """Methods by mean unseen `metric` over the tasks that pass the gate (and that every method ran), best first.

    Each entry: method, mean, mean rank (1 = best per task), and the tasks where it beats / trails RoPE
    beyond the spread.
    """
    passed = gate(summary)
    tasks = [t for t, rows in summary.items() if passed[t]["passed"]
             and all(m in rows and rows[m]["unseen"] is not None and rows[m]["unseen"].get(metric) is not None
                     for m in methods)]
    if not tasks:
        return []
    ranks: dict[str, list[int]] = defaultdict(list)
    for task in tasks:
        order = sorted(methods, key=lambda m: -summary[task][m]["unseen"][metric])
        for position, method in enumerate(order, 1):
            ranks[method].append(position)
    out = []
    for method in methods:
        values = [summary[t][method]["unseen"][metric] for t in tasks]
        base = {t: summary[t][BASELINE]["unseen"] for t in tasks}
        out.append({"method": method, "mean": sum(values) / len(values), "tasks": tasks,
                    "mean_rank": sum(ranks[method]) / len(tasks),
                    "beats_baseline": [t for t in tasks if exceeds(summary[t][method]["unseen"], base[t], metric)],
                    "trails_baseline": [t for t in tasks if exceeds(base[t], summary[t][method]["unseen"], metric)]})
    return sorted(out, key=lambda e: -e["mean"])
