"""When one model's `eval run` cannot say whether it extrapolates: the lines `eval run` prints under its result.

A cliff near 0 reads as "this model extrapolates", but without a baseline it says so only when (1) the spans
pin the cliff down well enough to tell 0 from the cliff a plain-RoPE baseline shows, and (2) the model trained
long enough for a baseline to show one at all. The evidence for both numbers is the smallest stored
reproduction with a measured baseline cliff (EVIDENCE): preset cpu-small, w = 64, 1,638,400 training tokens
(25,600 sequences of w), baseline cliff 0.336 ± 0.028 SE nats at 8w over 400 spans, PosAug's -0.029.
A model trained on fewer sequences with a small cliff, or whose ±2 SE interval holds both 0 and 0.336, gets a
line naming the fix (more spans, a longer run, or a baseline of the same budget through `eval report`).
"""

from __future__ import annotations

EVIDENCE = "benchmarks/results/reproduce_cpu-small_seed42.md"
EVIDENCE_CLIFF = 0.336  # nats: the baseline cliff at 8w in EVIDENCE
EVIDENCE_SEQUENCES = 25_600  # sequences of w trained in EVIDENCE (1,638,400 tokens at w = 64)

__all__ = ["EVIDENCE", "EVIDENCE_CLIFF", "EVIDENCE_SEQUENCES", "caveats"]


def caveats(record: dict) -> list[str]:
    """The lines saying why this record's cliff cannot tell extrapolation apart (empty when it can)."""
    lines = []
    sequences = (record.get("run_info") or {}).get("consumed_samples")
    for length, entry in sorted(record.get("lengths", {}).items(), key=lambda kv: int(kv[0])):
        cliff = entry.get("cliff")
        if not cliff:
            continue
        value, se, spans = cliff["cliff"], cliff.get("se"), len((entry.get("per_span") or {}).get("ood", []))
        if se is None:
            lines.append(f"L={length}: {spans} span(s) give no standard error: this cliff cannot be told from 0 or "
                         f"from a baseline's; pass --num-spans 20 or more")
        elif value - 2 * se <= 0 <= EVIDENCE_CLIFF <= value + 2 * se:
            lines.append(f"L={length}: cliff {value:+.3f} ± {se:.3f} SE over {spans} spans holds both 0 and the "
                         f"{EVIDENCE_CLIFF} nats of a baseline that does not extrapolate ({EVIDENCE}): too few spans "
                         "to say anything; pass more --num-spans (and enough validation data)")
        if sequences is not None and sequences < EVIDENCE_SEQUENCES and value < EVIDENCE_CLIFF / 2:
            lines.append(f"L={length}: a cliff of {value:+.3f} after {sequences:,} training sequences says little: the "
                         f"smallest budget at which a stored baseline shows its cliff is {EVIDENCE_SEQUENCES:,} "
                         f"sequences ({EVIDENCE}); below it a baseline may show none either. Train longer (e.g. train "
                         "--preset cpu-small) or evaluate a baseline of the same budget and compare (eval report)")
    return lines
