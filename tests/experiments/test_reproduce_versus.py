"""PosAug against each reproduction row: paired over spans per seed, wins / losses / ties under the evidence rule."""

from pretrain.experiments.reproduce_versus import posaug_lines, versus

BASE = [4.0, 4.2, 3.9, 4.1, 4.05, 3.95]


def _record(label, seed, cliffs, shift=0.0):
    return {"label": label, "seed": seed, "per_span": {"in_dist": [b + shift for b in BASE],
                                                       "ood": [b + shift + c for b, c in zip(BASE, cliffs)]}}


def test_a_clearly_lower_posaug_cliff_is_a_win_and_a_higher_in_dist_loss_a_loss():
    records = [_record("posaug", 1, [0.0, 0.01, -0.01, 0.0, 0.02, -0.02], shift=0.2),
               _record("prope", 1, [0.3, 0.32, 0.29, 0.31, 0.3, 0.28])]
    assert versus(records, "posaug", "prope", "cliff")["verdict"] == "lower"
    assert versus(records, "posaug", "prope", "in_dist")["verdict"] == "higher"
    assert posaug_lines(records, ["baseline", "posaug", "prope"]) == [
        posaug_lines(records, ["prope"])[0]]
    assert "cliff wins" in posaug_lines(records, ["prope"])[0] and "in-dist loss loses" in posaug_lines(
        records, ["prope"])[0]


def test_a_gap_inside_the_seed_spread_is_a_tie():
    records = [_record("posaug", 1, [0.0] * 6), _record("ssmax", 1, [0.1] * 6),
               _record("posaug", 2, [0.0] * 6), _record("ssmax", 2, [-0.2] * 6)]
    for r in records:
        r["per_span"]["ood"][0] += 1e-4  # finite paired SE
    result = versus(records, "posaug", "ssmax", "cliff")
    assert abs(result["delta"]) > 2 * result["se"] and result["verdict"] == "no significant difference"
