"""The Table 2 row's report (issue 59): our baseline and PosAug beside the paper's row, and the merge of one-seed
reports of the same preset and budget into one table with seed SEs.

  python benchmarks/table2_report.py merge OUT_SEED42 OUT_SEED137 --output OUT_MERGED
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

# ../shared/papers/posaug.md, Table 2: 10.6M, w = 2048, 500M tokens, eval at 16K (cliff and G(16K) in nats)
PAPER_ROW = {"baseline": {"cliff": 1.915, "gain": -0.293, "in_dist": 4.087},
             "posaug": {"cliff": 0.060, "gain": 2.042, "in_dist": 4.160, "penalty": 0.018, "delta_gain": 2.34}}
METHODS = ("baseline", "posaug")


class MergeError(Exception):
    """Reports that cannot be merged: one line for the user."""


def _t(values: list[float]) -> list[float]:
    return [float(v) for v in values]


def _se(values: list[float]) -> float:
    """Standard error of the mean; NaN for fewer than two values."""
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan


def gain_at(record: dict, length: int) -> float:
    """The record's exact G(length) (JSON keys are strings), NaN where it was not computed."""
    values = (record.get("context_gain") or {}).get("values") or {}
    value = values.get(str(length), values.get(length))
    return math.nan if value is None else float(value)


def per_seed(records: list[dict], length: int) -> dict[int, dict]:
    """For each seed with both runs: each method's cliff, G, in-dist, and the paired (span by span) comparison."""
    by_seed: dict[int, dict[str, dict]] = {}
    for record in records:
        by_seed.setdefault(record["seed"], {})[record["label"]] = record
    rows = {}
    for seed, runs in sorted(by_seed.items()):
        if not all(m in runs for m in METHODS):
            continue
        row = {}
        for method in METHODS:
            cliff = runs[method]["lengths"][str(length)]["cliff"]
            row[method] = {"cliff": cliff["cliff"], "in_dist": cliff["in_dist"], "gain": gain_at(runs[method], length)}
        base, aug = runs["baseline"]["per_span"], runs["posaug"]["per_span"]
        reduction = [(bo - bi) - (ao - ai) for bo, bi, ao, ai in
                     zip(_t(base["ood"]), _t(base["in_dist"]), _t(aug["ood"]), _t(aug["in_dist"]))]
        in_diff = [a - b for a, b in zip(_t(aug["in_dist"]), _t(base["in_dist"]))]
        b_in = row["baseline"]["in_dist"]
        row["paired"] = {"spans": len(reduction), "cliff_reduction": statistics.fmean(reduction),
                         "cliff_reduction_se": _se(reduction), "in_dist_diff": statistics.fmean(in_diff),
                         "in_dist_diff_se": _se(in_diff), "penalty": (row["posaug"]["in_dist"] - b_in) / b_in,
                         "penalty_se": _se(in_diff) / b_in}
        rows[seed] = row
    return rows


def _cell(values: list[float], digits: int = 3, percent: bool = False) -> str:
    scale, suffix = (100, " %") if percent else (1, "")
    values = [v * scale for v in values if math.isfinite(v)]
    if not values:
        return "—"
    se = _se(values)
    return f"{statistics.fmean(values):.{digits}f}" + (f" ± {se:.{digits}f}" if math.isfinite(se) else "") + suffix


def render(results: dict) -> str:
    """report.md: the budget line first, then our rows beside the paper's, the paired comparison and the data."""
    length, seeds = results["eval_length"], per_seed(results["records"], results["eval_length"])
    n = len(seeds)
    kind = f"mean ± SE over {n} seeds" if n > 1 else "one seed"
    lines = ["| Row | Method | Cliff ↓ | G({}) ↑ | In-dist | Penalty | ΔG |".format(length),
             "|---|---|---|---|---|---|---|"]
    for method in METHODS:
        cliff = [r[method]["cliff"] for r in seeds.values()]
        gain = [r[method]["gain"] for r in seeds.values()]
        in_dist = [r[method]["in_dist"] for r in seeds.values()]
        penalty = "—" if method == "baseline" else _cell([r["paired"]["penalty"] for r in seeds.values()], 1, True)
        delta = "—" if method == "baseline" else _cell([r["posaug"]["gain"] - r["baseline"]["gain"]
                                                        for r in seeds.values()], 2)
        lines.append(f"| ours ({kind}) | {method} | {_cell(cliff)} | {_cell(gain)} | {_cell(in_dist)} | "
                     f"{penalty} | {delta} |")
    for method, row in PAPER_ROW.items():
        penalty = f"{100 * row['penalty']:.1f} %" if "penalty" in row else "—"
        delta = f"+{row['delta_gain']:.2f}" if "delta_gain" in row else "—"
        lines.append(f"| paper, Table 2 (10.6M, 500M tokens) | {method} | {row['cliff']:.3f} | {row['gain']:.3f} | "
                     f"{row['in_dist']:.3f} | {penalty} | {delta} |")
    paired = [f"- seed {seed}: cliff reduction {r['paired']['cliff_reduction']:.3f} ± "
              f"{r['paired']['cliff_reduction_se']:.3f} SE, in-dist {r['paired']['in_dist_diff']:+.3f} ± {r['paired']['in_dist_diff_se']:.3f} SE nats "
              f"(penalty {100 * r['paired']['penalty']:.1f} ± {100 * r['paired']['penalty_se']:.1f} %), "
              f"paired over {r['paired']['spans']} spans" for seed, r in seeds.items()]
    data = results.get("data") or {}
    unique = data.get("train_tokens")
    seen = f", each seen ~{results['train_tokens'] / unique:.2f} times per run" if unique else ""
    return f"""{results['first_line']}

# The paper's Table 2 row: preset `{results['preset']}`, w = {results['window']}, eval at {length}

{results['train_tokens']:,} training tokens per run ({results['steps']} steps; the paper's budget for this preset:
{results['target_tokens']:,}), seeds {sorted(seeds)}, baseline and PosAug side by side with the same data order and
initial weights; {results.get('device', '?')}. Cliff = loss beyond w − loss within it on {results['num_spans']} spans
of {length} tokens of the validation split; G({length}) exact over the first {results['gain_spans']} spans.

{chr(10).join(lines)}

Paired, span by span (PosAug against the baseline of the same seed):
{chr(10).join(paired)}

Data: {data.get('corpus', '?')} ({data.get('documents', '?')} documents), byte-level BPE of
{data.get('vocab_size', '?')} tokens trained on it; {unique or 0:,} unique training tokens{seen};
{data.get('valid_tokens', 0):,} validation tokens (held-out documents, never trained on).
"""


def write(out: Path, results: dict) -> Path:
    """results.json and report.md in out; the report's path."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "report.md").write_text(render(results))
    return out / "report.md"


def merge(results: list[dict]) -> dict:
    """One-seed results of the same preset and budget as one (refused otherwise)."""
    first = results[0]
    for other in results[1:]:
        for key in ("preset", "train_tokens", "eval_length", "num_spans"):
            if other[key] != first[key]:
                raise MergeError(f"reports differ in {key} ({first[key]} vs {other[key]}): merge only the same "
                                 "preset and budget")
    seeds = [r["seed"] for result in results for r in result["records"] if r["label"] == "baseline"]
    if len(set(seeds)) != len(seeds):
        raise MergeError(f"a seed appears twice ({sorted(seeds)}): merge each seed's report once")
    merged = {**first, "records": [r for result in results for r in result["records"]], "seeds": sorted(seeds)}
    merged["first_line"] = (f"{len(seeds)} seeds ({', '.join(map(str, sorted(seeds)))}) of one budget; "
                            f"seed {results[0]['seeds'][0]}'s budget line: {first['first_line']}")
    return merged


def main(argv: list[str] | None = None) -> int:
    """merge DIR... --output DIR."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("merge",))
    parser.add_argument("reports", nargs="+", help="folders holding a results.json each")
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    try:
        loaded = []
        for folder in args.reports:
            path = Path(folder) / "results.json"
            if not path.is_file():
                raise MergeError(f"{path} is missing: pass folders written by benchmarks/gpu_table2.py")
            loaded.append(json.loads(path.read_text()))
        print(write(Path(args.output), merge(loaded)).read_text())
        return 0
    except MergeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
