"""The report's findings, computed from the results: each method against the RoPE baseline, and the papers.

Every sentence here is a function of the measured accuracies and their binomial standard errors;
the only constants are the papers' published numbers (PAPER_CLAIMS), each quoted with its
source and metric. A difference counts as real when it exceeds 2 SE of the difference (SEs of
the two means combined as if independent; both methods see the same held-out examples, so this
is conservative for paired differences) and 2 seed SEs (the sd over seeds of the per-seed
differences / sqrt(seeds)): the spread of the seeds measured as a standard error, not as a sum of
ranges that grows with every seed. A claimed similarity needs an equivalence test
(`equivalent`: two one-sided tests against a stated margin), never just "no difference measured".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .verdict import BASELINE, GATE, TOST_Z, Z, equivalent, gate, seed_se, significance  # noqa: F401

SEEN_TARGET = GATE  # the baseline must learn the task in distribution, else unseen numbers test nothing


@dataclass(frozen=True)
class PaperClaim:
    """One published pair: `method` vs `baseline` on `task`, in the paper's own metric."""

    source: str
    task: str
    method: str
    baseline: str
    method_value: float | None  # % (None: the paper gives no number, only the direction)
    baseline_value: float | None
    metric: str  # the paper's metric, in words
    ours: str  # which of our numbers is closest: "unseen" (lengths N+1..4N) or "all" (lengths 2..4N)
    metric_key: str = "accuracy"  # ours in the paper's metric: "accuracy" (exact match) or "token_accuracy"


_WARP = "Index warping Table A (sequence accuracy averaged over lengths 2..5M, train U(2, M))"
_RUOSS = "Ruoss et al. Table 1 (per-token accuracy on unseen lengths 41..500, chance 50 %, best of 30 runs)"
PAPER_CLAIMS: tuple[PaperClaim, ...] = (
    PaperClaim("RFS Table 1 / Fig. 3 (exact match on unseen lengths 21..40, train ≤ 20, 12 layers, 40k steps)",
               "copy", "rfs", BASELINE, 83.7, None, "unseen exact match", "unseen"),
    *(PaperClaim(_WARP, task, method, BASELINE, value, base, "mean sequence accuracy", "all")
      for task, base, values in (("copy", 19.2, {"alibi": 27.9, "rpe": 26.8, "warp": 43.2}),
                                 ("reverse", 20.4, {"alibi": 22.4, "rpe": 39.3, "warp": 39.8}),
                                 ("sort", 18.8, {"alibi": 33.6, "rpe": 43.0, "warp": 53.7}),
                                 ("summation", 27.9, {"alibi": 33.0, "rpe": 32.2, "warp": 29.5}))
      for method, value in values.items()),
    *(PaperClaim(_RUOSS, task, method, BASELINE, value, base, "per-token accuracy", "unseen", "token_accuracy")
      for task, base, values in (("reverse", 51.9, {"rpe": 69.9, "alibi": 62.3, "nope": 52.8}),
                                 ("duplicate", 50.9, {"rpe": 68.9, "alibi": 51.3, "nope": 52.8}),
                                 ("missing_duplicate", 56.5, {"rpe": 88.7, "alibi": 54.3, "nope": 52.5}))
      for method, value in values.items()),
)


def _spread_keys(metric: str) -> tuple[str, str]:
    """(binomial SE key, seed sd key) of `metric` in a summary part."""
    return ("se", "sd") if metric == "accuracy" else ("token_se", "token_sd")


def _pct(entry: dict, metric: str = "accuracy") -> str:
    se = _spread_keys(metric)[0]
    return f"{100 * entry[metric]:.1f} ± {100 * entry[se]:.1f}"


def difference(a: dict, b: dict, metric: str = "accuracy") -> tuple[float, float, str]:
    """(a − b, SE of the difference, 'higher' | 'lower' | 'no significant difference').

    Significant means beyond 2 binomial SEs and, with several seeds, beyond 2 seed SEs of the per-seed differences
    (`significance`), the rule the tables' bold and the rankings use.
    """
    se_key = _spread_keys(metric)[0]
    delta, se = a[metric] - b[metric], math.sqrt(a[se_key] ** 2 + b[se_key] ** 2)
    return delta, se, significance(delta, se, seed_se(a, b, metric))


def all_lengths(row: dict, count: int) -> dict:
    """Mean exact match over every evaluated length ≥ 2 (the warping paper's Table A averaging), ± SE, and an
    upper bound of its seed sd (the mean of the per-length sds)."""
    pairs = [(a, sd) for length, a, sd in zip(row["lengths"], row["accuracy"],
                                                row.get("accuracy_sd", [0.0] * len(row["lengths"]))) if length >= 2]
    accuracy = [a for a, _ in pairs]
    n = count * len(row["seeds"])
    se = math.sqrt(sum(a * (1 - a) / n for a in accuracy)) / len(accuracy)
    return {"accuracy": sum(accuracy) / len(accuracy), "se": se, "sd": sum(sd for _, sd in pairs) / len(pairs),
            "n_seeds": len(row["seeds"])}


def reach(row: dict, threshold: float = 0.5) -> int:
    """Longest length n with exact match ≥ `threshold` at every evaluated length up to n (0 if none)."""
    longest = 0
    for length, accuracy in zip(row["lengths"], row["accuracy"]):
        if accuracy < threshold:
            break
        longest = length
    return longest


def reach_table(summary: dict[str, dict[str, dict]], methods: list[str]) -> str:
    """Tasks × methods: reach (lengths past the training maximum N that still hold ≥ 50 %)."""
    lines = ["**Reach**: longest length n with ≥ 50 % exact match at every length ≤ n (training max N in the "
             "first column)", "", "| Task (N) | " + " | ".join(methods) + " |", "|" + "---|" * (len(methods) + 1)]
    passed = gate(summary)
    for task, rows in summary.items():
        n = next(iter(rows.values()))["train_lengths"][1]
        cells = [f"{reach(rows[m])} ({reach(rows[m]) - n:+d})" if m in rows else "—" for m in methods]
        label = f"{task} ({n})" + ("" if passed[task]["passed"] else " (not learned — no verdict)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def nope_findings(summary: dict[str, dict[str, dict]], methods: list[str]) -> list[str]:
    """Per task: do the RoPE position augmentations beat dropping positions altogether (NoPE)?"""
    lines = []
    passed = gate(summary)
    for task, rows in summary.items():
        if "nope" not in rows or rows["nope"]["unseen"] is None or not passed[task]["passed"]:
            continue
        verdicts: dict[str, list[str]] = {"higher": [], "no significant difference": [], "lower": []}
        for method in methods:
            if method in (BASELINE, "nope", "alibi") or method not in rows:
                continue
            verdicts[difference(rows[method]["unseen"], rows["nope"]["unseen"])[2]].append(method)
        lines.append(f"- **{task}** vs NoPE ({_pct(rows['nope']['unseen'])} unseen): above it "
                     f"{', '.join(verdicts['higher']) or 'none'}; within 2 SE "
                     f"{', '.join(verdicts['no significant difference']) or 'none'}; below it "
                     f"{', '.join(verdicts['lower']) or 'none'}.")
    return lines


def baseline_findings(summary: dict[str, dict[str, dict]], methods: list[str]) -> list[str]:
    """Per task: does the baseline learn seen lengths, and which methods beat / tie / trail it unseen."""
    lines = []
    for task, rows in summary.items():
        base = rows.get(BASELINE)
        if base is None:
            lines.append(f"- **{task}**: no RoPE baseline in this run; no comparison.")
            continue
        learned = base["seen"]["accuracy"] >= SEEN_TARGET
        head = (f"- **{task}**: {BASELINE} seen {_pct(base['seen'])} % "
                + (f"(≥ {100 * SEEN_TARGET:.0f} %: the baseline learned the task)" if learned else
                   f"(**below {100 * SEEN_TARGET:.0f} %: the baseline did not learn the task in distribution — "
                   f"not learned, no length-generalisation verdict**)"))
        if not learned:
            lines.append(head + ".")
            continue
        parts = []
        for method in methods:
            if method == BASELINE or method not in rows or rows[method]["unseen"] is None:
                continue
            delta, se, verdict = difference(rows[method]["unseen"], base["unseen"])
            word = {"higher": "beats", "lower": "trails", "no significant difference": "does not beat"}[verdict]
            note = ""
            seen_delta, _, seen_verdict = difference(rows[method]["seen"], base["seen"])
            if seen_verdict == "lower":
                note = f"; in distribution it loses {-100 * seen_delta:.1f} points (seen {_pct(rows[method]['seen'])})"
            parts.append(f"{method} {word} it on unseen lengths ({_pct(rows[method]['unseen'])} vs "
                         f"{_pct(base['unseen'])}, Δ {100 * delta:+.1f} ± {100 * se:.1f}){note}")
        lines.append(head + ("; " + "; ".join(parts) + "." if parts else "."))
    return lines


def paper_comparison(summary: dict[str, dict[str, dict]], count: int) -> list[str]:
    """One line per published pair we also measured: theirs, ours, and whether the direction agrees."""
    lines = []
    passed = gate(summary)
    for claim in PAPER_CLAIMS:
        rows = summary.get(claim.task, {})
        if claim.method not in rows or claim.baseline not in rows or not passed[claim.task]["passed"]:
            continue

        def ours(method: str) -> dict | None:
            return rows[method]["unseen"] if claim.ours == "unseen" else all_lengths(rows[method], count)

        mine, base = ours(claim.method), ours(claim.baseline)
        if mine is None or base is None or mine.get(claim.metric_key) is None or base.get(claim.metric_key) is None:
            continue
        delta, se, verdict = difference(mine, base, claim.metric_key)
        sd_key = _spread_keys(claim.metric_key)[1]
        if claim.baseline_value is None:
            theirs = f"{claim.method} {claim.method_value:.1f} ({claim.baseline} without it: near 0 in Fig. 3)"
            paper_direction = "higher"
        else:
            theirs = (f"{claim.method} {claim.method_value:.1f} vs {claim.baseline} {claim.baseline_value:.1f} "
                      f"(Δ {claim.method_value - claim.baseline_value:+.1f})")
            paper_direction = "higher" if claim.method_value > claim.baseline_value else "lower"
        if verdict == paper_direction:
            agreement = "same direction"
        elif verdict == "no significant difference":
            agreement = "not reproduced (no significant difference here)"
        else:
            agreement = "**opposite direction**"
        scope = "unseen lengths" if claim.ours == "unseen" else "all lengths 2..4N"
        name = "exact match" if claim.metric_key == "accuracy" else "per-token accuracy"
        lines.append(f"- {claim.task}, {claim.method} vs {claim.baseline} — paper ({claim.source}): {theirs}; "
                     f"ours ({scope}, {name}): {_pct(mine, claim.metric_key)} vs {_pct(base, claim.metric_key)} "
                     f"(Δ {100 * delta:+.1f} ± {100 * se:.1f} SE"
                     + (f", seed sd {100 * mine.get(sd_key, 0.0):.1f} / {100 * base.get(sd_key, 0.0):.1f}"
                        if len(rows[claim.method].get("seeds", [])) > 1 else "")
                     + f") → {agreement}.")
    return lines
