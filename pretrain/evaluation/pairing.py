"""Which baseline a run is compared with, and how paired differences combine over seeds.

One rule for `reproduce`'s report (pretrain.experiments.reproduce, reproduce_versus) and `eval report`
(report.aggregate): a run is compared with the baseline of its own group (model size) and seed, because runs of
one seed share their data order and initial weights, so the seed-to-seed spread cancels in the difference.
A run whose seed has no baseline is paired with nothing; callers say so rather than fall back to a mean.
"""

from __future__ import annotations

import math
import statistics
from typing import Callable, Hashable, Iterable


def _no_group(record: dict) -> Hashable:
    return None


def pair_by_seed(records: Iterable[dict], is_baseline: Callable[[dict], bool],
                 group: Callable[[dict], Hashable] = _no_group) -> list[tuple[dict, dict | None]]:
    """(record, the baseline record of the same group and seed, or None) for every record, in order.

    A baseline is paired with itself. Two baselines of one group and seed are ambiguous: ValueError naming both.
    """
    records = list(records)
    baselines: dict[tuple[Hashable, object], dict] = {}
    for record in records:
        if is_baseline(record):
            key = (group(record), record.get("seed"))
            if key in baselines:
                raise ValueError(f"two baseline records for {_where(key)}: {baselines[key]['run']!r} and "
                                 f"{record['run']!r}; keep one of them in the records passed")
            baselines[key] = record
    return [(record, baselines.get((group(record), record.get("seed")))) for record in records]


def _where(key: tuple[Hashable, object]) -> str:
    group, seed = key
    return (f"size {group}, " if group is not None else "") + f"seed {seed}"


def over_seeds(deltas: list[float], span_ses: list[float] | None = None) -> dict[str, float]:
    """Per-seed paired differences → {mean, span_se, seed_se, seeds}.

    span_se: the SE of the mean from the per-seed SEs over spans (sqrt(Σ se²) / n), NaN without them;
    seed_se: the SE of the per-seed differences over seeds (sd / √n), NaN for fewer than two seeds.
    """
    n = len(deltas)
    if not n:
        return {"mean": math.nan, "span_se": math.nan, "seed_se": math.nan, "seeds": 0}
    span_se = math.sqrt(sum(s * s for s in span_ses)) / n if span_ses and len(span_ses) == n else math.nan
    seed_se = statistics.stdev(deltas) / math.sqrt(n) if n > 1 else math.nan
    return {"mean": statistics.fmean(deltas), "span_se": span_se, "seed_se": seed_se, "seeds": n}
