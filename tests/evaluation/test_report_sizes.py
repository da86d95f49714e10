"""`eval report` across model sizes: every method is compared with the baseline of its own size
(penalty, cliff, G(C), ΔG), mean ± std over seeds. Hand-made records; < 1 s."""

import math

import pytest

from pretrain.evaluation.report import aggregate, size_table


def _record(size, method, seed, in_dist, cliff, gain, params):
    return {"run": f"{size}_{method}_s{seed}", "label": f"{size}_{method}", "size": size, "method": method,
            "seed": seed, "parameters": params, "train_window": 64,
            "lengths": {"512": {"loss": in_dist, "curve": [in_dist] * 511,
                                "cliff": {"in_dist": in_dist, "ood": in_dist + cliff, "cliff": cliff}}},
            "context_gain": {"method": "exact", "window": 16, "values": {"256": gain}}}


RECORDS = [
    _record("10m", "baseline", 1, 4.0, 1.0, 0.10, 10e6), _record("10m", "baseline", 2, 4.2, 1.2, 0.20, 10e6),
    _record("10m", "posaug", 1, 4.2, 0.1, 0.30, 10e6), _record("10m", "posaug", 2, 4.2, 0.3, 0.40, 10e6),
    _record("113m", "baseline", 1, 3.0, 2.0, 0.50, 113e6), _record("113m", "baseline", 2, 3.0, 2.2, 0.70, 113e6),
    _record("113m", "posaug", 1, 3.3, 0.2, 0.90, 113e6),
]


def _rows():
    return {(row["size"], row["method"]): row["metrics"] for row in aggregate(RECORDS, baseline="baseline")}


def test_each_size_has_its_penalty_against_its_own_baseline():
    rows = _rows()
    assert rows[("10m", "posaug")]["penalty@512"][0] == pytest.approx(0.1 / 4.1)
    assert rows[("113m", "posaug")]["penalty@512"][0] == pytest.approx(0.1)
    assert rows[("10m", "baseline")]["penalty@512"][0] == pytest.approx(0.0)


def test_delta_g_is_against_the_mean_g_of_the_same_size_baseline():
    rows = _rows()
    assert rows[("10m", "posaug")]["ΔG(256)"] == pytest.approx((0.35 - 0.15, math.sqrt(0.005)))
    assert rows[("113m", "posaug")]["ΔG(256)"][0] == pytest.approx(0.9 - 0.6)
    assert math.isnan(rows[("113m", "posaug")]["ΔG(256)"][1])  # one seed: no std


def test_cliff_is_mean_and_sample_std_over_seeds_per_size():
    rows = _rows()
    assert rows[("10m", "baseline")]["cliff@512"] == pytest.approx((1.1, math.sqrt(0.02)))
    assert rows[("113m", "baseline")]["cliff@512"] == pytest.approx((2.1, math.sqrt(0.02)))


def test_rows_go_from_small_to_large_with_the_baseline_first():
    order = [(row["size"], row["method"]) for row in aggregate(RECORDS, baseline="baseline")]
    assert order == [("10m", "baseline"), ("10m", "posaug"), ("113m", "baseline"), ("113m", "posaug")]


def test_a_size_without_a_baseline_gets_no_penalty():
    rows = aggregate(RECORDS + [_record("1b", "posaug", 1, 2.0, 0.1, 1.0, 1e9)], baseline="baseline")
    lone = next(row for row in rows if row["size"] == "1b")
    assert "penalty@512" not in lone["metrics"] and "ΔG(256)" not in lone["metrics"]


def test_size_table_is_the_papers_table_2_across_sizes():
    table = size_table(aggregate(RECORDS, baseline="baseline"))
    lines = table.splitlines()
    assert lines[0] == "| size | method | n | in-dist penalty | cliff (L=512) | G(256) | ΔG(256) |"
    assert lines[2] == "| 10m | baseline | 2 | (baseline) | 1.100 ± 0.141 | 0.150 ± 0.071 | — |"
    assert lines[3].startswith("| 10m | posaug | 2 | 2.4 ± 0.0 % | 0.200 ± 0.141 |")
    assert lines[5] == "| 113m | posaug | 1 | 10.0 % | 0.200 | 0.900 | 0.300 |"
