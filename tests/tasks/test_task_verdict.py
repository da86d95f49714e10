"""Seeds aggregation, the learnability gate and spread-aware bolding, on hand-made results. Runtime ~2 s."""

import dataclasses
import json
import math

import pytest

from conftest import REPO
from pretrain.tasks.evaluate import LengthResult, summarize
from pretrain.tasks.verdict import aggregate, best, exceeds, gate, ranking


def record(task, method, seed, seen, unseen, count=100, n=2, unseen_lengths=2, token=None):
    """One run's eval record: every seen length at `seen`, every unseen one at `unseen` (exact match)."""
    results = []
    for length in range(1, n + unseen_lengths + 1):
        accuracy = seen if length <= n else unseen
        token_accuracy = token if (token is not None and length > n) else accuracy
        results.append(LengthResult(length, round(accuracy * count), count, length <= n,
                                    round(token_accuracy * 10 * count), 10 * count))
    return {"task": task, "method": method, "seed": seed, "train_lengths": [1, n],
            "lengths": [r.to_dict() for r in results], "summary": summarize(results)}


def results_file(tmp_path, records):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"records": records}))
    return json.loads(path.read_text())["records"]


def test_seeds_are_averaged_with_their_standard_deviation_and_each_seeds_binomial_se():
    summary = aggregate([record("copy", "baseline", 42, 1.0, 0.2), record("copy", "baseline", 137, 1.0, 0.4)])
    unseen = summary["copy"]["baseline"]["unseen"]
    assert unseen["accuracy"] == pytest.approx(0.3)
    assert unseen["sd"] == pytest.approx(math.sqrt(0.02))  # sample sd of 0.2 and 0.4
    assert [p["seed"] for p in unseen["per_seed"]] == [42, 137]
    assert unseen["per_seed"][0]["se"] == pytest.approx(math.sqrt(0.2 * 0.8 / 100) / math.sqrt(2))
    assert summary["copy"]["baseline"]["accuracy"] == pytest.approx([1.0, 1.0, 0.3, 0.3])


def test_one_seed_has_zero_spread():
    unseen = aggregate([record("copy", "baseline", 42, 1.0, 0.2)])["copy"]["baseline"]["unseen"]
    assert unseen["sd"] == 0.0 and unseen["token_sd"] == 0.0


def test_per_token_accuracy_is_averaged_over_unseen_lengths_beside_exact_match():
    unseen = aggregate([record("reverse", "rpe", 42, 1.0, 0.0, token=0.7)])["reverse"]["rpe"]["unseen"]
    assert unseen["accuracy"] == 0.0 and unseen["token_accuracy"] == pytest.approx(0.7)


def test_a_task_whose_baseline_misses_95_percent_seen_fails_the_gate(tmp_path):
    records = results_file(tmp_path, [record("copy", "baseline", 42, 0.99, 0.0),
                                      record("sort", "baseline", 42, 0.90, 0.0)])
    verdict = gate(aggregate(records))
    assert verdict["copy"]["passed"] and not verdict["sort"]["passed"]
    assert verdict["sort"]["seen"] == pytest.approx(0.90)


def test_the_gate_is_on_the_mean_over_seeds():
    records = [record("copy", "baseline", 42, 0.99, 0.0), record("copy", "baseline", 137, 0.90, 0.0)]
    assert not gate(aggregate(records))["copy"]["passed"]  # mean 0.945


def test_a_task_that_fails_the_gate_is_left_out_of_the_ranking(tmp_path):
    records = results_file(tmp_path, [
        record("copy", "baseline", 42, 1.0, 0.1), record("copy", "rfs", 42, 1.0, 0.8),
        record("sort", "baseline", 42, 0.5, 0.0), record("sort", "rfs", 42, 0.5, 0.9)])
    ranked = ranking(aggregate(records), ["baseline", "rfs"])
    assert ranked[0]["tasks"] == ["copy"]
    assert [(e["method"], e["mean"]) for e in ranked] == [("rfs", pytest.approx(0.8)), ("baseline", pytest.approx(0.1))]
    assert ranked[0]["beats_baseline"] == ["copy"]


def test_the_report_marks_an_unlearned_task_and_bolds_nothing_in_its_row(tmp_path):
    from pretrain.tasks.presets import PRESETS
    from pretrain.tasks.report import write_report

    records = [record(t, m, s, seen, unseen) for s in (42, 137)
               for t, m, seen, unseen in (("copy", "baseline", 1.0, 0.1), ("copy", "rfs", 1.0, 0.8),
                                          ("sort", "baseline", 0.5, 0.0), ("sort", "rfs", 0.5, 0.9))]
    preset = dataclasses.replace(PRESETS["cpu-tiny"], methods=("baseline", "rfs"), tasks={"copy": (1, 2), "sort": (1, 2)})
    timing = {"wall_s": 1, "train_cpu_s": 1, "eval_cpu_s": 1, "jobs": 1, "cores": 2, "runs": 4,
              "train_runs_timed": 4, "load_start": "1", "load_end": "1"}
    text = write_report(tmp_path, "hand-made", preset, records, [42, 137], timing).read_text()
    assert "| sort | 2 | 50.0, 50.0 | 50.0 | **not learned — no length-generalisation verdict** |" in text
    assert "| copy | 2 | 100.0, 100.0 | 100.0 | learned |" in text
    sort_row = next(line for line in text.splitlines() if line.startswith("| sort (not learned"))
    copy_row = next(line for line in text.splitlines() if line.startswith("| copy |") and "±" in line)
    assert "**" not in sort_row and "**80.0 ± 0.0" in copy_row
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["gate"]["sort"]["passed"] is False and result["ranking"]["accuracy"][0]["tasks"] == ["copy"]
    assert (tmp_path / "accuracy_sort.png").stat().st_size > 0


def part(accuracy, spread, se=0.01):
    """Two seeds at accuracy ± spread (per-seed values, from which the seed SE of a difference is taken)."""
    return {"accuracy": accuracy, "se": se,
            "per_seed": [{"seed": 1, "accuracy": accuracy + spread}, {"seed": 2, "accuracy": accuracy - spread}]}


def test_an_advantage_within_the_seed_spread_is_not_a_win():
    # per-seed Δ 0.10 ± (0.08 + 0.05): seed SE 0.13, 2 seed SE 0.26 > 0.10
    assert not exceeds(part(0.60, 0.08), part(0.50, -0.05))
    assert exceeds(part(0.70, 0.02), part(0.50, -0.01))


def test_an_advantage_within_two_binomial_ses_is_not_a_win_even_without_spread():
    assert not exceeds(part(0.52, 0.0, se=0.01), part(0.50, 0.0, se=0.01))


def test_the_row_best_is_bolded_only_when_its_lead_over_the_runner_up_exceeds_the_spread():
    rows = {"baseline": {"unseen": part(0.1, 0.01)}, "rfs": {"unseen": part(0.8, 0.05)},
            "rpe": {"unseen": part(0.75, -0.05)}}
    assert best(rows, ["baseline", "rfs", "rpe"]) is None
    rows["rpe"]["unseen"] = part(0.5, 0.05)  # the same seed offsets as rfs: Δ 0.3 on both seeds
    assert best(rows, ["baseline", "rfs", "rpe"]) == "rfs"


def test_stored_records_under_the_former_name_rope_count_as_the_baseline():
    summary = aggregate([record("copy", "rope", 42, 1.0, 0.2), record("copy", "baseline", 137, 1.0, 0.4)])
    assert list(summary["copy"]) == ["baseline"] and summary["copy"]["baseline"]["seeds"] == [42, 137]


def test_the_stored_task_results_are_compared_against_the_baseline_as_before_the_rename():
    from pretrain.experiments.rederive import task_comparisons

    stored = json.loads((REPO / "benchmarks" / "results" / "tasks_cpu-small_seed42_results.json").read_text())
    assert {r["method"] for r in stored["records"]} >= {"rope"}  # written before the rename, never rewritten
    claims = task_comparisons(stored)
    assert claims and all(c["claim"].endswith("vs baseline (unseen exact match)") for c in claims)


# rederive (pretrain.experiments.rederive): stored verdicts re-derived under the evidence rule.

def two_seed_records(ranking=None):
    """A task-suite results.json: seeds move both rows alike (Δ 0.3 on each seed) but their sds sum to 0.42, so the
    former rule (beyond sd_a + sd_b) saw no difference and the evidence rule (2 SE, 2 seed SE) sees one."""
    records = [record("copy", "baseline", 42, 1.0, 0.1), record("copy", "baseline", 137, 1.0, 0.4),
               record("copy", "rfs", 42, 1.0, 0.4), record("copy", "rfs", 137, 1.0, 0.7)]
    return {"records": records, **({"ranking": ranking} if ranking is not None else {})}


def run_rederive(tmp_path, capsys, *files):
    from pretrain.experiments.rederive import main

    paths = []
    for i, content in enumerate(files):
        path = tmp_path / f"{i}_results.json"
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        paths.append(str(path))
    status = main(paths)
    out, err = capsys.readouterr()
    return status, out, err


def test_rederive_skips_a_results_file_that_is_neither_an_ablation_nor_a_task_suite_in_one_line(tmp_path, capsys):
    lm_table = {"preset": "cpu-small", "seeds": [42], "summary": {"baseline": {"n": 1, "cliff": [0.3, 0.0]}}}
    status, out, err = run_rederive(tmp_path, capsys, lm_table)
    assert status == 0 and not err
    assert out.count("\n") == 1 and "skipped" in out


def test_rederive_goes_on_to_the_task_files_after_a_skipped_one(tmp_path, capsys):
    documents = {"summary": {}, "records": [{"run": "baseline_s42", "method": "baseline", "seed": 42}]}
    status, out, _ = run_rederive(tmp_path, capsys, documents, two_seed_records())
    assert status == 0 and "1_results.json: 2 of 2 verdicts change" in out  # exact match and per-token


def test_rederive_reports_a_missing_file_in_one_line_with_exit_status_2(tmp_path, capsys):
    from pretrain.experiments.rederive import main

    status = main([str(tmp_path / "missing_results.json")])
    out, err = capsys.readouterr()
    assert status == 2 and not out
    assert err.count("\n") == 1 and "missing_results.json" in err and "Traceback" not in err


def test_rederive_reports_an_unreadable_json_in_one_line_with_exit_status_2(tmp_path, capsys):
    status, out, err = run_rederive(tmp_path, capsys, "{not json")
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err


def test_rederive_sets_task_verdicts_against_the_stored_ranking_not_the_former_rule():
    from pretrain.experiments.rederive import task_comparisons

    stored = [{"method": m, "tasks": ["copy"], "beats_baseline": ["copy"] if m == "rfs" else [],
               "trails_baseline": []} for m in ("rfs", "baseline")]
    [claim] = [c for c in task_comparisons(two_seed_records({"accuracy": stored})) if "exact match" in c["claim"]]
    assert (claim["old"], claim["old_from"], claim["new"]) == ("higher", "stored ranking", "higher")


def test_rederive_reads_a_ranking_stored_under_the_former_names_rope_beats_rope():
    from pretrain.experiments.rederive import stored_ranking

    stored = {"accuracy": [{"method": "rfs", "tasks": ["copy", "sort"], "beats_rope": ["copy"],
                            "trails_rope": ["sort"]}]}
    assert stored_ranking({"ranking": stored}, "accuracy") == {("rfs", "copy"): "higher",
                                                               ("rfs", "sort"): "lower"}


def test_rederive_falls_back_to_the_former_rule_recomputed_where_the_file_stores_no_ranking():
    from pretrain.experiments.rederive import task_comparisons

    [claim] = [c for c in task_comparisons(two_seed_records()) if "exact match" in c["claim"]]
    assert (claim["old"], claim["old_from"], claim["new"]) == ("no significant difference",
                                                               "former rule, recomputed", "higher")


def test_the_stored_pose_on_sort_verdict_is_unchanged_by_rederive():
    # The audit's case: the former rule recomputed said "no significant difference"; the file's ranking says beats.
    from pretrain.experiments.rederive import task_comparisons

    stored = json.loads((REPO / "benchmarks" / "results" / "tasks_cpu-long_methods_2seeds_results.json").read_text())
    [claim] = [c for c in task_comparisons(stored)
               if c["task"] == "sort" and c["claim"] == "pose vs baseline (unseen exact match)"]
    assert claim["old"] == claim["new"] == "higher" and claim["old_from"] == "stored ranking"


def test_rederive_names_the_se_of_method_vs_rope_verdicts_independent_binomial(tmp_path, capsys):
    _, out, _ = run_rederive(tmp_path, capsys, two_seed_records())
    lines = [x for x in out.splitlines() if x.startswith("  copy — rfs vs baseline")]
    assert lines and all("independent binomial SE" in x and "paired SE" not in x for x in lines)


def test_rederive_rederives_the_per_token_verdicts_against_rope_too():
    from pretrain.experiments.rederive import task_comparisons

    records = [record("copy", "baseline", 42, 1.0, 0.1, token=0.5), record("copy", "rfs", 42, 1.0, 0.4, token=0.9)]
    claims = {c["claim"]: c["new"] for c in task_comparisons({"records": records})}
    assert claims["rfs vs baseline (unseen per-token accuracy)"] == "higher"


def versus_file(verdict, paired=True):
    results = two_seed_records()
    results["versus_posaug"] = {"accuracy": {"baseline": {"copy": {
        "delta": 0.10, "se": 0.01, "seed_se": 0.01, "verdict": verdict, "seeds": 2, "paired": paired}}}}
    return results


def test_rederive_rederives_the_stored_posaug_versus_verdicts_from_their_paired_se():
    from pretrain.experiments.rederive import versus_comparisons

    [item] = versus_comparisons(versus_file("no significant difference"))
    assert (item["old"], item["new"], item["se_kind"]) == ("no significant difference", "higher", "paired SE")


def test_rederive_names_an_unpaired_stored_versus_result_independent_binomial():
    from pretrain.experiments.rederive import versus_comparisons

    [item] = versus_comparisons(versus_file("higher", paired=False))
    assert item["se_kind"] == "independent binomial SE"


def test_rederive_notes_where_paired_and_independent_posaug_vs_rope_verdicts_differ():
    from pretrain.experiments.rederive import paired_disagreements

    independent = [{"task": "copy", "claim": "posaug vs baseline (unseen exact match)", "new": "no significant "
                    "difference", "se": 0.05}]
    paired = [{"task": "copy", "claim": "posaug vs baseline (unseen exact match)", "new": "higher", "se": 0.01,
               "seed_se": 0.0, "se_kind": "paired SE"}]
    [note] = paired_disagreements(independent, paired)
    assert "higher with the paired SE" in note and "no significant difference with independent" in note
