"""The report's computed findings: method vs baseline verdicts, paper agreement, runtime text. Runtime < 1 s."""

from pretrain.tasks.compare import all_lengths, baseline_findings, difference, paper_comparison
from pretrain.tasks.report import runtime_text


def part(accuracy, se=0.01):
    return {"accuracy": accuracy, "se": se}


def row(seen, unseen, accuracy=(1.0, 1.0, 0.0, 0.0)):
    return {"seen": part(seen), "unseen": part(unseen), "lengths": [1, 2, 3, 4], "accuracy": list(accuracy),
            "seeds": [42], "train_lengths": [1, 2]}


def test_a_difference_beyond_two_standard_errors_is_higher_or_lower():
    assert difference(part(0.5), part(0.4))[2] == "higher"
    assert difference(part(0.4), part(0.5))[2] == "lower"


def test_a_difference_within_two_standard_errors_is_not_significant():
    assert difference(part(0.42), part(0.4))[2] == "no significant difference"


def _seeds(entry, *values):
    return {**entry, "per_seed": [{"seed": s, "accuracy": v} for s, v in enumerate(values)]}


def test_a_difference_within_two_seed_ses_of_the_per_seed_differences_is_not_significant_however_small_the_se():
    # per-seed Δ 0.2 and 0.0: seed SE 0.1, so Δ 0.1 is inside 2 seed SE
    assert difference(_seeds(part(0.5), 0.6, 0.4), _seeds(part(0.4), 0.4, 0.4))[2] == "no significant difference"
    # per-seed Δ 0.12 and 0.08: seed SE 0.02, Δ 0.1 beyond it (the old sum of sds, 0.06 + 0, would not matter)
    assert difference(_seeds(part(0.5), 0.52, 0.48), _seeds(part(0.4), 0.4, 0.4))[2] == "higher"


def test_equivalence_needs_the_whole_90_percent_interval_inside_the_margin():
    from pretrain.tasks.compare import equivalent

    assert equivalent(0.01, 0.01, 0.0, margin=0.05)  # 0.01 + 1.645·0.01 < 0.05
    assert not equivalent(0.01, 0.03, 0.0, margin=0.05)  # no difference measured, yet not shown equivalent
    assert not equivalent(0.01, 0.01, 0.03, margin=0.05)  # the seeds' spread counts too
    assert not equivalent(0.0, 0.0, 0.0, margin=0.0)


def test_findings_say_which_methods_beat_and_which_do_not_beat_the_baseline():
    summary = {"copy": {"baseline": row(0.99, 0.10), "rfs": row(0.99, 0.40), "rpe": row(0.99, 0.11)}}
    text = baseline_findings(summary, ["baseline", "rfs", "rpe"])[0]
    assert "rfs beats it" in text and "rpe does not beat it" in text and "did not learn" not in text


def test_findings_flag_a_baseline_below_95_percent_on_seen_lengths():
    text = baseline_findings({"copy": {"baseline": row(0.80, 0.0)}}, ["baseline"])[0]
    assert "did not learn the task in distribution" in text


def test_findings_report_a_method_that_loses_accuracy_in_distribution():
    text = baseline_findings({"copy": {"baseline": row(0.99, 0.1), "posaug": row(0.70, 0.1)}}, ["baseline", "posaug"])[0]
    assert "in distribution it loses 29.0 points" in text


def test_paper_comparison_calls_a_reversed_difference_opposite():
    # Warping Table A: warp 43.2 vs RoPE 19.2 on copy (all lengths); here warp is far worse.
    summary = {"copy": {"baseline": row(1.0, 0.5, (1.0, 1.0, 1.0, 1.0)), "warp": row(1.0, 0.0, (1.0, 0.0, 0.0, 0.0))}}
    lines = [line for line in paper_comparison(summary, count=200) if "warp vs baseline" in line]
    assert len(lines) == 1 and "opposite direction" in lines[0]


def test_paper_comparison_skips_pairs_this_run_did_not_measure():
    assert paper_comparison({"copy": {"baseline": row(1.0, 0.1)}}, count=200) == []


def test_all_lengths_mean_starts_at_length_two_like_the_warping_paper():
    assert all_lengths(row(1.0, 0.0, (0.0, 1.0, 1.0, 0.0)), count=200)["accuracy"] == 2 / 3


def test_runtime_text_labels_the_quiet_machine_wall_time_an_estimate_from_cpu_time():
    timing = {"wall_s": 3600, "train_cpu_s": 1500, "eval_cpu_s": 300, "jobs": 2, "cores": 2, "runs": 16,
              "train_runs_timed": 16, "load_start": "9.0", "load_end": "3.0"}
    text = runtime_text(timing)
    assert "60.0 min wall" in text and "30.0 min" in text and "≈ CPU / 2 = 15.0 min (an estimate" in text
    assert "9.0" in text


def test_runtime_text_sums_the_wall_time_of_every_invocation_of_a_split_run():
    timing = {"wall_s": 5, "train_cpu_s": 1500, "eval_cpu_s": 300, "jobs": 2, "cores": 2, "runs": 16,
              "train_runs_timed": 16, "load_start": "0.1", "load_end": "0.2",
              "invocations": [{"wall_s": 3000, "jobs": 2, "load_start": "1.0", "load_end": "2.0"},
                              {"wall_s": 1800, "jobs": 2, "load_start": "2.5", "load_end": "2.1"}]}
    text = runtime_text(timing)
    assert "80.0 min wall in 2 invocation(s)" in text and "(50.0 + 30.0 min, the longest 50.0" in text
    assert "1.0 → 2.0, 2.5 → 2.1" in text and "this invocation" not in text


def test_runtime_text_names_each_machine_that_trained_and_counts_invocations_that_did_not_record_one():
    timing = {"wall_s": 5, "train_cpu_s": 1500, "eval_cpu_s": 300, "jobs": 2, "cores": 2, "runs": 16,
              "train_runs_timed": 16, "load_start": "0.1", "load_end": "0.2",
              "invocations": [{"wall_s": 60, "jobs": 2, "load_start": "1.0", "load_end": "2.0"},
                              {"wall_s": 60, "jobs": 2, "load_start": "1.0", "load_end": "2.0", "machine": "B"},
                              {"wall_s": 60, "jobs": 2, "load_start": "1.0", "load_end": "2.0", "machine": "A"},
                              {"wall_s": 60, "jobs": 2, "load_start": "1.0", "load_end": "2.0", "machine": "B"}]}
    assert "; trained on A; B (1 earlier invocation(s) did not record their machine)" in runtime_text(timing)


def test_a_report_only_report_without_recorded_invocations_claims_no_wall_time():
    timing = {"wall_s": 5, "train_cpu_s": 1500, "eval_cpu_s": 300, "jobs": 2, "cores": 2, "runs": 16,
              "train_runs_timed": 16, "load_start": "0.1", "load_end": "0.2", "report_only": True}
    text = runtime_text(timing)
    assert "wall time not recorded" in text and "0.1 min" not in text and "30.0 min" in text


def test_record_invocation_updates_its_own_record_and_keeps_the_others(tmp_path):
    from pretrain.tasks.suite import record_invocation

    record_invocation(tmp_path, {"invocation": "a", "started": "12:00:00", "wall_s": 1})
    record_invocation(tmp_path, {"invocation": "b", "started": "12:00:00", "wall_s": 2})
    assert record_invocation(tmp_path, {"invocation": "b", "started": "12:00:00", "wall_s": 3}) == [
        {"invocation": "a", "started": "12:00:00", "wall_s": 1}, {"invocation": "b", "started": "12:00:00", "wall_s": 3}]


def test_two_invocations_started_in_the_same_second_keep_two_records(tmp_path):
    from pretrain.tasks.suite import invocation_id, record_invocation

    record_invocation(tmp_path, {"invocation": invocation_id(), "started": "12:00:00", "wall_s": 0.4})
    assert len(record_invocation(tmp_path, {"invocation": invocation_id(), "started": "12:00:00", "wall_s": 9})) == 2


def test_reach_is_the_longest_length_before_accuracy_first_drops_below_half():
    from pretrain.tasks.compare import reach

    assert reach(row(1.0, 0.0, (1.0, 0.9, 0.4, 0.8))) == 2


def test_nope_findings_sort_augmentations_above_within_and_below_nope():
    from pretrain.tasks.compare import nope_findings

    summary = {"copy": {"baseline": row(1.0, 0.0), "nope": row(1.0, 0.3), "rfs": row(1.0, 0.6), "rpe": row(1.0, 0.31), "warp": row(1.0, 0.1)}}
    text = nope_findings(summary, ["baseline", "rfs", "rpe", "warp", "nope"])[0]
    assert "above it rfs;" in text and "within 2 SE rpe;" in text and "below it warp." in text


def test_a_task_the_baseline_did_not_learn_gets_no_verdict_against_nope_or_the_papers():
    from pretrain.tasks.compare import nope_findings

    summary = {"copy": {"baseline": row(0.80, 0.0), "nope": row(0.9, 0.3), "rfs": row(0.9, 0.6),
                        "warp": row(0.9, 0.6, (1.0, 1.0, 1.0, 1.0))}}
    assert nope_findings(summary, ["baseline", "rfs", "nope"]) == []
    assert paper_comparison(summary, count=200) == []
    assert "rfs beats" not in baseline_findings(summary, ["baseline", "rfs"])[0]
