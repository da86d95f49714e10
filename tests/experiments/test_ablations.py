"""The ablation suite: each table's rows as the paper describes them, the conclusion checker, the whole suite on cpu-tiny.

Runtime: the e2e test trains the 15 rows of Tables 5, 9, 10 and 11 at cpu-tiny (16 steps each; mostly process
start-up) and evaluates them, ~3 CPU-minutes, then reruns the command to check that it resumes.
"""

import json
import math
import subprocess
import sys

import pytest

from conftest import REPO
from pretrain.experiments.ablation_tables import ROWS, SHAPES, TABLES, Claim, Conclusion, row_preset, rows_of
from pretrain.experiments.ablations import PRESETS, row_config, shaped
from pretrain.experiments.ablations_report import check, claim_verdict, compare, summarise
from pretrain.table import SIZES


def _posaug(name):
    return ROWS[name].positions


def _range(name):
    p = _posaug(name)
    return p["alpha_min"], p["alpha_max"]


# ---------------------------------------------------------------- rows as the paper describes them

def test_table5_rows_are_the_three_alpha_ranges():
    assert [_range(r) for r in TABLES[5].rows if r != "baseline"] == [(1 / 8, 8.0), (1 / 16, 16.0), (1 / 32, 32.0)]
    assert all(_posaug(r)["alpha_distribution"] == "uniform" for r in ("posaug", "posaug_16", "posaug_32"))


def test_table5_is_read_at_8w_and_every_other_table_at_4w():
    assert {n: t.eval_factor for n, t in TABLES.items()} == {5: 8, 6: 4, 7: 4, 8: 4, 9: 4, 10: 4, 11: 4}


def test_table6_rows_are_fixed_8_fixed_4_discrete_cycle_and_random_base():
    assert (_posaug("fixed_8")["alpha_distribution"], _posaug("fixed_8")["alpha_fixed"]) == ("fixed", 8.0)
    assert (_posaug("fixed_4")["alpha_distribution"], _posaug("fixed_4")["alpha_fixed"]) == ("fixed", 4.0)
    assert (_posaug("discrete")["alpha_distribution"], _posaug("discrete")["alpha_values"]) == ("discrete", (1, 2, 4, 8))
    assert (_posaug("cycle")["alpha_distribution"], _posaug("cycle")["alpha_values"]) == ("cycle", (1, 2, 4, 8))
    base = _posaug("random_base")
    assert (base["strategy"], base["base_min_factor"], base["base_max_factor"]) == ("random_base", 1 / 8, 8.0)
    assert "alpha_min" not in base  # the base is drawn instead of scaling positions


def test_table7_rows_fix_b_at_8_and_vary_a_or_downscale_only():
    assert {r: _range(r) for r in TABLES[7].rows if r != "baseline"} == {
        "posaug": (1 / 8, 8.0), "range_1_8": (1.0, 8.0), "range_2nd_8": (0.5, 8.0), "range_8th_1": (1 / 8, 1.0)}


def test_table8_curricula_and_distributions():
    linear = _posaug("curriculum_linear")
    assert (linear["curriculum"], linear["curriculum_start_min"], linear["curriculum_start_max"],
            _range("curriculum_linear")) == ("linear", 0.5, 2.0, (1 / 8, 8.0))  # [1/2, 2] → [1/8, 8]
    for name, rng in (("curriculum_step", (1 / 8, 8.0)), ("curriculum_step_16", (1 / 16, 16.0)),
                      ("curriculum_step_log_uniform", (1 / 8, 8.0))):
        assert (_posaug(name)["curriculum"], _posaug(name)["curriculum_fraction"], _range(name)) == ("step", 0.5, rng)
    assert _posaug("log_uniform")["alpha_distribution"] == "log_uniform"
    assert _posaug("curriculum_step_log_uniform")["alpha_distribution"] == "log_uniform"
    assert _range("posaug_16") == (1 / 16, 16.0) and "posaug_16" in TABLES[8].rows


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_table9_shapes_are_twice_as_deep_and_narrower_and_half_as_deep_and_wider(preset):
    base = SIZES[PRESETS[preset].model].architecture
    deep, wide = shaped(base, "deep"), shaped(base, "wide")
    assert deep["num_layers"] == 2 * base["num_layers"] and wide["num_layers"] == base["num_layers"] // 2
    assert deep["hidden_size"] < base["hidden_size"] < wide["hidden_size"]
    for shape, fields in (("deep", deep), ("wide", wide)):
        assert fields["hidden_size"] / base["hidden_size"] == pytest.approx(SHAPES[shape][1], abs=0.1)
        assert (fields["hidden_size"] // base["num_attention_heads"]) % 2 == 0  # RoPE rotates pairs


def _non_embedding(fields):
    h, f, L = fields["hidden_size"], fields["ffn_hidden_size"], fields["num_layers"]
    return L * (4 * h * h + 3 * h * f)


def test_table9_shapes_have_a_similar_size_to_the_standard_model():
    base = SIZES["cpu-small"].architecture
    for shape in ("deep", "wide"):
        ratio = _non_embedding({**base, **shaped(base, shape)}) / _non_embedding(base)
        assert 0.6 < ratio < 1.5  # the paper's 15.3M and 7.6M around 10.6M


def test_table9_pairs_a_baseline_and_posaug_per_shape():
    assert [(ROWS[r].shape, ROWS[r].positions["strategy"]) for r in TABLES[9].rows] == [
        ("deep", "none"), ("deep", "posaug"), ("standard", "none"), ("standard", "posaug"),
        ("wide", "none"), ("wide", "posaug")]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_table10_scales_the_bottom_or_top_half_of_the_layers_or_each_layer_independently(preset, tmp_path):
    layers = SIZES[PRESETS[preset].model].architecture["num_layers"]
    for name, mode, count in (("layers_bottom", "bottom", layers // 2), ("layers_top", "top", layers // 2)):
        positions = row_config(PRESETS[preset], name, 1, "data", tmp_path / name).positions
        assert (positions.layer_mode, positions.layer_count) == (mode, count)
    assert row_config(PRESETS[preset], "layers_independent", 1, "d", tmp_path / "i").positions.layer_mode == "independent"


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_table11_trains_longer_windows_on_the_same_tokens_in_fewer_steps(preset, tmp_path):
    p = PRESETS[preset]
    for name, factor in (("baseline_2w", 2), ("baseline_4w", 4), ("posaug_2w", 2)):
        config = row_config(p, name, 1, "data", tmp_path / name)
        assert config.model.seq_length == factor * p.window
        assert config.schedule.train_iters * config.schedule.global_batch_size * config.model.seq_length == \
            p.train_tokens
        assert row_preset(p, ROWS[name]).train_iters == p.train_iters // factor
    assert ROWS["posaug_2w"].positions == ROWS["posaug"].positions


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_row_makes_a_valid_config_that_differs_from_the_baseline_only_where_the_row_says(preset, tmp_path):
    p = PRESETS[preset]
    base = row_config(p, "baseline", 7, "data", tmp_path / "b")
    for name in ROWS:
        config = row_config(p, name, 7, "data", tmp_path / name)
        assert config.seed == 7 and config.data.data_path == "data"
        assert (config.optimizer.lr, config.schedule.global_batch_size) == (base.optimizer.lr,
                                                                           base.schedule.global_batch_size)
        if ROWS[name].shape == "standard":
            assert config.model.hidden_size == base.model.hidden_size
            assert config.model.num_layers == base.model.num_layers


def test_shared_rows_are_trained_once_with_the_baseline_and_posaug_first():
    rows = rows_of(sorted(TABLES))
    assert rows[:2] == ["baseline", "posaug"] and len(rows) == len(set(rows)) == len(ROWS) == 27
    assert "posaug_16" in TABLES[5].rows and "posaug_16" in TABLES[8].rows


# ---------------------------------------------------------------- the conclusion checker

def _record(row, seed, in_dist, ood, gain=None):
    per_span = {"in_dist": in_dist, "ood_4w": ood, "ood_8w": ood}
    if gain is not None:
        per_span["gain_4w"] = gain
    return {"row": row, "seed": seed, "run": f"{row}_s{seed}", "per_span": per_span}


BASE = [2.0, 2.1, 1.9, 2.0, 2.05, 1.95]


def _cliffs(row, seed, cliffs, shift=0.0, gain=None):
    return _record(row, seed, [b + shift for b in BASE], [b + shift + c for b, c in zip(BASE, cliffs)], gain)


LOWER = Conclusion("a lowers the cliff", (Claim("a", "baseline", "cliff", "lower"),))


def test_a_clearly_lower_cliff_is_reproduced():
    records = [_cliffs("baseline", 1, [1.0, 1.1, 0.9, 1.0, 1.05, 0.95]), _cliffs("a", 1, [0.2, 0.3, 0.1, 0.2, 0.25, 0.2])]
    assert check(LOWER, records, 4)["verdict"] == "reproduced"


def test_a_clearly_higher_cliff_is_the_opposite():
    records = [_cliffs("baseline", 1, [0.2, 0.3, 0.1, 0.2, 0.25, 0.2]), _cliffs("a", 1, [1.0, 1.1, 0.9, 1.0, 1.05, 0.95])]
    assert check(LOWER, records, 4)["verdict"] == "opposite"


def test_a_difference_within_two_paired_standard_errors_is_not_significant():
    records = [_cliffs("baseline", 1, [1.0] * 6), _cliffs("a", 1, [1.3, 0.7, 1.2, 0.8, 1.0, 0.95])]
    result = check(LOWER, records, 4)
    assert result["verdict"] == "no significant difference"
    part = result["parts"][0]["result"]
    assert abs(part["delta"]) <= 2 * part["se"]


def test_the_paired_standard_error_is_taken_over_span_differences():
    differences = [0.1, 0.3, 0.2, 0.4, 0.0, 0.2]
    records = [_cliffs("baseline", 1, [1.0] * 6), _cliffs("a", 1, [1.0 - d for d in differences])]
    result = compare(records, "a", "baseline", "cliff_4w")
    mean = sum(differences) / 6
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / 5)
    assert result["delta"] == pytest.approx(-mean)
    assert result["se"] == pytest.approx(sd / math.sqrt(6))


def test_a_difference_inside_the_seed_spread_is_not_significant_even_beyond_two_se():
    # Both seeds agree span by span (tiny SE), but the seeds' cliffs differ by more than the gap.
    records = [_cliffs("baseline", 1, [1.0] * 6), _cliffs("a", 1, [0.9] * 6),
               _cliffs("baseline", 2, [2.0] * 6), _cliffs("a", 2, [1.9] * 6)]
    for r in records:  # break the exact ties so the paired SE is finite and small
        r["per_span"]["ood_4w"][0] += 1e-4
    records[2]["per_span"]["ood_4w"] = [o - 0.3 for o in records[2]["per_span"]["ood_4w"]]  # seed 2: Δ -0.4, not -0.1
    result = compare(records, "a", "baseline", "cliff_4w")
    assert abs(result["delta"]) > 2 * result["se"] and abs(result["delta"]) <= 2 * result["seed_se"]
    assert result["verdict"] == "no significant difference"


def test_the_seed_spread_enters_as_the_standard_error_of_the_per_seed_differences():
    records = [_cliffs("baseline", 1, [1.0] * 6), _cliffs("a", 1, [0.9] * 6),
               _cliffs("baseline", 2, [2.0] * 6), _cliffs("a", 2, [1.5] * 6)]
    for r in records:
        r["per_span"]["ood_4w"][0] += 1e-4
    result = compare(records, "a", "baseline", "cliff_4w")
    assert result["seed_se"] == pytest.approx(abs(-0.1 - -0.5) / 2, abs=1e-4)  # sd of (-0.1, -0.5) / sqrt(2)
    assert result["verdict"] == "no significant difference"  # |Δ| = 0.3 < 2 seed SE = 0.4


def test_a_claimed_similarity_needs_equivalence_and_is_opposite_with_a_significant_difference():
    assert claim_verdict("similar", "no significant difference", True) == "reproduced"
    assert claim_verdict("similar", "no significant difference", False) == "inconclusive"
    assert claim_verdict("similar", "lower") == "opposite"
    assert claim_verdict("lower", "higher") == "opposite"
    assert claim_verdict("higher", "no significant difference") == "no significant difference"


def test_a_claimed_no_better_is_contradicted_only_by_a_significant_difference_the_excluded_way():
    assert claim_verdict("not_lower", "higher") == "reproduced"
    assert claim_verdict("not_lower", "no significant difference") == "reproduced"
    assert claim_verdict("not_lower", "lower") == "opposite"


def test_a_conclusion_is_reproduced_only_when_every_comparison_is_and_opposite_when_any_is():
    both = Conclusion("a: lower cliff, higher in-dist", (Claim("a", "baseline", "cliff", "lower"),
                                                        Claim("a", "baseline", "in_dist", "higher")))
    lower_cliff = [0.2, 0.3, 0.1, 0.2, 0.25, 0.2]
    base = _cliffs("baseline", 1, [1.0, 1.1, 0.9, 1.0, 1.05, 0.95])
    assert check(both, [base, _cliffs("a", 1, lower_cliff, shift=0.5)], 4)["verdict"] == "reproduced"
    assert check(both, [base, _cliffs("a", 1, lower_cliff, shift=0.0)], 4)["verdict"] == "no significant difference"
    assert check(both, [base, _cliffs("a", 1, lower_cliff, shift=-0.5)], 4)["verdict"] == "opposite"


def test_each_checked_comparison_carries_the_papers_own_difference_and_our_posaug_effect():
    records = [_cliffs("baseline", 1, [1.0] * 6), _cliffs("posaug", 1, [0.4, 0.5, 0.3, 0.4, 0.45, 0.35]),
               _cliffs("a", 1, [0.2, 0.3, 0.1, 0.2, 0.25, 0.2])]
    part = check(LOWER, records, 4, paper={"a": {"cliff": 0.5}, "baseline": {"cliff": 2.0}})["parts"][0]
    assert part["paper_delta"] == pytest.approx(-1.5)
    assert part["posaug_minus_baseline"] == pytest.approx(-0.6)


def test_a_conclusion_on_g_without_g_measured_is_not_measured():
    claim = Conclusion("a raises G", (Claim("a", "baseline", "gain", "higher"),))
    records = [_cliffs("baseline", 1, [1.0] * 6), _cliffs("a", 1, [1.0] * 6)]
    assert check(claim, records, 4)["verdict"] == "not measured"


def test_the_summary_reports_delta_and_penalty_against_the_same_seeds_baseline():
    records = [_cliffs("baseline", 1, [1.0] * 6), _cliffs("a", 1, [0.5] * 6, shift=0.2)]
    summary = summarise(records)
    assert summary["a"]["in_dist"]["mean"] == pytest.approx(2.2)
    assert summary["a"]["delta"]["delta"] == pytest.approx(0.2)
    assert summary["a"]["penalty"] == pytest.approx(0.1)
    assert summary["a"]["cliff_4w"]["mean"] == pytest.approx(0.5)


def test_a_report_of_part_of_the_plan_says_partial_and_marks_the_rows_not_run(tmp_path):
    from pretrain.experiments.ablations_report import write_report

    records = [_cliffs("baseline", 42, [1.0] * 6), _cliffs("posaug", 42, [0.2] * 6, shift=0.1)]
    timing = {"runs_timed": 2, "train_cpu_s": 60.0, "train_wall_s": 90.0, "cores": 2, "invocations": []}
    report = write_report(tmp_path, "cpu-tiny", PRESETS["cpu-tiny"], [6], records, timing,
                          planned={"seeds": [42], "tables": [6]}).read_text()
    assert "Partial: 5 of 7 planned" in report and report.count("not run yet") == 5
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["partial_missing"] == 5
    assert [c["verdict"] for c in results["conclusions"]["6"]] == ["not measured"] * 3


# ---------------------------------------------------------------- the command

def test_an_unknown_table_is_a_one_line_error_with_exit_code_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pretrain", "reproduce", "--suite", "ablations", "--tables", "4,6",
                           "--output", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--tables" in proc.stderr and "Traceback" not in proc.stderr


def test_reproduce_hands_suite_ablations_to_the_ablation_runner_and_other_suites_to_reproduce():
    ablations = subprocess.run([sys.executable, "-m", "pretrain", "reproduce", "--suite", "ablations", "--help"],
                               cwd=REPO, capture_output=True, text=True, timeout=120)
    assert ablations.returncode == 0 and "--tables" in ablations.stdout
    lm = subprocess.run([sys.executable, "-m", "pretrain", "reproduce", "--help"], cwd=REPO, capture_output=True,
                        text=True, timeout=120)
    assert lm.returncode == 0 and "--methods" in lm.stdout and "--tables" not in lm.stdout


# The tables whose rows change more than the positions: Table 5 is read at 8w (the others at 4w), Table 9 changes
# the model's shape, Table 10 the layers PosAug scales, Table 11 the training window. The rows of Tables 6-8 differ
# from these only in positions.* fields: each row's config is checked above
# (test_every_row_makes_a_valid_config_...), each of their strategies and curricula trains through Megatron in
# tests/megatron_ext/test_positions_megatron.py, and their report sections are written from constructed records here.
E2E_TABLES = (5, 9, 10, 11)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(1800)  # ~2 min on 2 quiet cores; 11 min at load average 20–50
def test_cpu_tiny_runs_the_tables_that_change_model_window_or_layers_end_to_end_and_resumes(tmp_path):
    command = [sys.executable, "-m", "pretrain", "reproduce", "--suite", "ablations", "--preset", "cpu-tiny",
               "--tables", ",".join(map(str, E2E_TABLES)), "--output", str(tmp_path)]
    first = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    report = (tmp_path / "report.md").read_text()
    for number in E2E_TABLES:
        assert f"## Table {number}:" in report
    assert "Partial" not in report and "not run yet" not in report
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["summary"]) == set(rows_of(list(E2E_TABLES)))
    assert all(c["verdict"] in ("reproduced", "opposite", "no significant difference", "inconclusive")
               for cs in results["conclusions"].values() for c in cs)
    assert (tmp_path / "cliff_vs_penalty.png").stat().st_size > 0
    second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "training " not in second.stdout  # every run and evaluation reused


def test_the_report_of_all_tables_from_records_of_every_row_has_every_table(tmp_path):
    from pretrain.experiments.ablations_report import write_report

    records = [_cliffs(name, 1, [1.0, 1.02, 0.98, 1.0, 1.01, 0.99]) for name in ROWS]
    timing = {"runs_timed": len(ROWS), "train_cpu_s": 60.0, "train_wall_s": 90.0, "cores": 2, "invocations": []}
    report = write_report(tmp_path, "cpu-tiny", PRESETS["cpu-tiny"], sorted(TABLES), records, timing,
                          planned={"seeds": [1], "tables": sorted(TABLES)}).read_text()
    for number in TABLES:
        assert f"## Table {number}:" in report
    assert "Partial" not in report and "not run yet" not in report


SIMILAR = Conclusion("a keeps the baseline's cliff", (Claim("a", "baseline", "cliff", "similar"),))


def _with_posaug(a_cliffs, seeds=(1,)):
    """Baseline cliffs 1.0, PosAug 0.2 (effect -0.8, margin 0.2), row a as given, per seed."""
    out = []
    for seed in seeds:
        out += [_cliffs("baseline", seed, [1.0, 1.02, 0.98, 1.0, 1.01, 0.99]),
                _cliffs("posaug", seed, [0.2, 0.22, 0.18, 0.2, 0.21, 0.19]), _cliffs("a", seed, a_cliffs[seed])]
    return out


def test_a_similarity_inside_the_margin_with_small_errors_is_reproduced_by_equivalence():
    records = _with_posaug({1: [1.01, 1.0, 0.99, 1.02, 1.0, 0.98]})
    result = check(SIMILAR, records, 4)
    assert result["verdict"] == "reproduced"
    assert result["parts"][0]["margin"] == pytest.approx(0.25 * 0.8, rel=0.05)


def test_a_similarity_with_errors_wider_than_the_margin_is_inconclusive_not_reproduced():
    # No significant difference (huge span noise), but the 90 % interval reaches past ±margin: no evidence either way.
    records = _with_posaug({1: [1.9, 0.1, 1.8, 0.2, 1.7, 0.3]})
    result = check(SIMILAR, records, 4)
    assert result["parts"][0]["result"]["verdict"] == "no significant difference"
    assert result["verdict"] == "inconclusive"


def test_a_similarity_without_the_reference_effect_is_not_measured():
    records = [_cliffs("baseline", 1, [1.0] * 6), _cliffs("a", 1, [1.0] * 6)]
    assert check(SIMILAR, records, 4)["verdict"] == "not measured"


def test_the_cost_line_names_the_machine_each_invocation_trained_on():
    from pretrain.experiments.ablations_report import _cost

    timing = {"runs_timed": 2, "train_cpu_s": 120, "train_wall_s": 60, "cores": 2,
              "invocations": [{"wall_s": 60, "load_start": "1.0", "load_end": "2.0", "machine": "AMD EPYC, AVX512"}]}
    assert _cost(timing, []).endswith("1.0→2.0; trained on AMD EPYC, AVX512.")
