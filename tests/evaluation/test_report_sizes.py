"""`eval report` across model sizes: every run is compared with the baseline of its own size and seed
(penalty, ΔG, paired cliff reduction; pretrain.evaluation.pairing, as `reproduce`), cliff and G(C) mean ± std over
seeds. Hand-made records; < 1 s."""

import math

import json

import pytest

from pretrain.evaluation import eval_cli
from pretrain.evaluation.report import aggregate, pairing_notes, size_table


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


def test_each_run_has_its_penalty_against_the_baseline_of_its_size_and_seed():
    rows = _rows()
    assert rows[("10m", "posaug")]["penalty@512"][0] == pytest.approx((0.2 / 4.0 + 0.0 / 4.2) / 2)
    assert rows[("113m", "posaug")]["penalty@512"][0] == pytest.approx(0.1)
    assert rows[("10m", "baseline")]["penalty@512"][0] == pytest.approx(0.0)


def test_delta_g_is_against_the_g_of_the_same_seed_baseline():
    rows = _rows()
    assert rows[("10m", "posaug")]["ΔG(256)"] == pytest.approx((0.2, 0.0))  # 0.30 - 0.10 and 0.40 - 0.20
    assert rows[("113m", "posaug")]["ΔG(256)"][0] == pytest.approx(0.9 - 0.5)  # seed 1's baseline, not the mean
    assert math.isnan(rows[("113m", "posaug")]["ΔG(256)"][1])  # one seed: no std


def test_paired_differences_carry_their_se_over_seeds_from_two_seeds_on():
    row = next(r for r in aggregate(RECORDS, baseline="baseline") if (r["size"], r["method"]) == ("10m", "posaug"))
    penalty = row["paired"]["penalty@512"]
    assert penalty["seeds"] == 2 and penalty["seed_se"] == pytest.approx(0.05 / 2)  # sd(0.05, 0) / sqrt(2)
    lone = next(r for r in aggregate(RECORDS, baseline="baseline") if (r["size"], r["method"]) == ("113m", "posaug"))
    assert math.isnan(lone["paired"]["penalty@512"]["seed_se"])


def test_a_run_whose_seed_has_no_baseline_is_named_and_left_out_not_compared_with_the_mean():
    rows = aggregate(RECORDS + [_record("10m", "posaug", 3, 5.0, 0.2, 0.5, 10e6)], baseline="baseline")
    posaug = next(r for r in rows if (r["size"], r["method"]) == ("10m", "posaug"))
    assert posaug["n"] == 3 and posaug["unpaired"] == ["10m_posaug_s3"]
    assert posaug["metrics"]["penalty@512"][0] == pytest.approx(0.025)  # seeds 1 and 2 only
    assert posaug["paired"]["penalty@512"]["seeds"] == 2
    [note] = pairing_notes(rows, "baseline")
    assert note.startswith("10m_posaug_s3 (size 10m): no 'baseline' run of the same size and seed, so no penalty")
    assert "(2 of 3 seeds paired)" in size_table(rows)


def test_eval_report_prints_the_line_for_a_run_without_a_same_seed_baseline(tmp_path, capsys):
    for record in RECORDS + [_record("10m", "posaug", 3, 5.0, 0.2, 0.5, 10e6)]:
        (tmp_path / f"{record['run']}.json").write_text(json.dumps(record))
    assert eval_cli(["report", str(tmp_path), "--output", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "note: 10m_posaug_s3 (size 10m): no 'baseline' run of the same size and seed" in printed
    assert "note: 10m_posaug_s3" in (tmp_path / "out" / "summary.md").read_text()


def test_two_baselines_of_one_size_and_seed_are_refused_by_name():
    twin = dict(_record("10m", "baseline", 1, 4.0, 1.0, 0.1, 10e6), run="10m_baseline_again_s1")
    with pytest.raises(ValueError, match="two baseline records for size 10m, seed 1: '10m_baseline_s1' and "
                                         "'10m_baseline_again_s1'"):
        aggregate(RECORDS + [twin], baseline="baseline")


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
    assert lines[0] == ("| size | method | n | in-dist penalty vs same-seed baseline | cliff (L=512) | G(256) | "
                        "ΔG(256) |")
    assert lines[2] == "| 10m | baseline | 2 | (baseline) | 1.100 ± 0.141 | 0.150 ± 0.071 | — |"
    assert lines[3] == ("| 10m | posaug | 2 | 2.5 % ± 2.5 % seed SE | 0.200 ± 0.141 | 0.350 ± 0.071 | "
                        "0.200 ± 0.000 seed SE |")
    assert lines[5] == "| 113m | posaug | 1 | 10.0 % | 0.200 | 0.900 | 0.400 |"


def _reproduce_record(label, seed, in_dist, ood):
    """A record as `reproduce` writes it: one length, per-span pieces on top."""
    return {"run": f"{label}_s{seed}", "label": label, "seed": seed, "train_window": 32,
            "lengths": {"256": {"loss": 0.0, "curve": [0.0] * 255,
                                "cliff": {"in_dist": sum(in_dist) / 2, "ood": sum(ood) / 2,
                                          "cliff": (sum(ood) - sum(in_dist)) / 2}}},
            "per_span": {"in_dist": in_dist, "ood": ood}}


def test_eval_report_on_reproduces_records_says_what_reproduces_report_says():
    from pretrain.experiments.presets import PRESETS
    from pretrain.experiments.reproduce import summarise

    records = [_reproduce_record("baseline", 42, [4.0, 4.2], [4.5, 4.9]),
               _reproduce_record("posaug", 42, [4.1, 4.3], [4.1, 4.4])]
    theirs = summarise(records, PRESETS["cpu-mini"])["posaug"]
    ours = next(r for r in aggregate(records, baseline="baseline") if r["label"] == "posaug")["metrics"]
    assert ours["reduction@256"][0] == pytest.approx(theirs["paired_reduction"][0])
    assert ours["reduction_se@256"][0] == pytest.approx(theirs["paired_se"][0])
    assert ours["penalty@256"][0] == pytest.approx(theirs["penalty"][0])


def test_eval_report_refuses_two_same_seed_baselines_in_one_line(tmp_path, capsys):
    twin = dict(_record("10m", "baseline", 1, 4.0, 1.0, 0.1, 10e6), run="10m_baseline_again_s1")
    for record in RECORDS + [twin]:
        (tmp_path / f"{record['run']}.json").write_text(json.dumps(record))
    assert eval_cli(["report", str(tmp_path), "--output", str(tmp_path / "out")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: two baseline records for size 10m, seed 1:")
