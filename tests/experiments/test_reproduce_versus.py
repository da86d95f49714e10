"""PosAug against each reproduction row, and each PosAug composition against its part: paired over spans per seed,
wins / losses / ties under the evidence rule."""

from pretrain.experiments.reproduce_report import _versus_text
from pretrain.experiments.reproduce_versus import comparison_lines, comparisons, pairs, versus

BASE = [4.0, 4.2, 3.9, 4.1, 4.05, 3.95]


def _record(label, seed, cliffs, shift=0.0):
    return {"label": label, "seed": seed, "per_span": {"in_dist": [b + shift for b in BASE],
                                                       "ood": [b + shift + c for b, c in zip(BASE, cliffs)]}}


def test_a_clearly_lower_posaug_cliff_is_a_win_and_a_higher_in_dist_loss_a_loss():
    records = [_record("posaug", 1, [0.0, 0.01, -0.01, 0.0, 0.02, -0.02], shift=0.2),
               _record("prope", 1, [0.3, 0.32, 0.29, 0.31, 0.3, 0.28])]
    assert versus(records, "posaug", "prope", "cliff")["verdict"] == "lower"
    assert versus(records, "posaug", "prope", "in_dist")["verdict"] == "higher"
    (line,) = comparison_lines(comparisons(records, ["baseline", "posaug", "prope"]))
    assert line.startswith("- posaug vs **prope**:") and "cliff wins" in line and "in-dist loss loses" in line


def test_a_gap_inside_the_seed_spread_is_a_tie():
    records = [_record("posaug", 1, [0.0] * 6), _record("ssmax", 1, [0.1] * 6),
               _record("posaug", 2, [0.0] * 6), _record("ssmax", 2, [-0.2] * 6)]
    for r in records:
        r["per_span"]["ood"][0] += 1e-4  # finite paired SE
    result = versus(records, "posaug", "ssmax", "cliff")
    assert abs(result["delta"]) > 2 * result["se"] and result["verdict"] == "no significant difference"


def test_each_posaug_composition_is_compared_with_its_part_and_posaug_with_every_row_but_the_baseline():
    labels = ["baseline", "posaug", "prope", "irope", "posaug_prope", "posaug_irope", "baseline+yarn"]
    assert pairs(labels) == [("posaug", "prope"), ("posaug", "irope"), ("posaug", "posaug_prope"),
                             ("posaug", "posaug_irope"), ("posaug_prope", "prope"), ("posaug_irope", "irope")]


def test_a_composition_is_compared_with_its_part_even_without_plain_posaug():
    assert pairs(["baseline", "prope", "posaug_prope"]) == [("posaug_prope", "prope")]


def test_a_report_without_posaug_says_why_it_has_no_posaug_verdicts():
    records = [_record("prope", 1, [0.3] * 6), _record("posaug_prope", 1, [0.1] * 6)]
    text = _versus_text(comparisons(records, ["prope", "posaug_prope"]), ["prope", "posaug_prope"])
    assert "posaug was not among this run's --methods" in text and "- posaug_prope vs **prope**" in text
