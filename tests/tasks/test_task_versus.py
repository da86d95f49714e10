"""PosAug against each row of the task suite, paired per held-out example (pretrain.tasks.versus)."""

import math
import statistics

import pytest

from pretrain.tasks.evaluate import LengthResult, summarize
from pretrain.tasks.verdict import aggregate
from pretrain.tasks.versus import seed_difference, versus, versus_all, versus_section


def record(method: str, seed: int, unseen: list[list[tuple[int, int]]], task: str = "copy",
           seen_right: int = 4, with_examples: bool = True) -> dict:
    """One seen length (every example of 4 answer tokens, `seen_right` right) and the given unseen lengths."""
    lengths = [[(seen_right, 4)] * 10, *unseen]
    results = [LengthResult(i + 1, sum(r == t for r, t in scores), len(scores), i == 0, sum(r for r, _ in scores),
                            sum(t for _, t in scores), tuple(scores) if with_examples else ())
               for i, scores in enumerate(lengths)]
    return {"method": method, "task": task, "seed": seed, "train_lengths": [1, 1],
            "lengths": [r.to_dict() for r in results],
            "summary": summarize(results)}


def test_exact_match_difference_pairs_per_example_with_the_sd_of_the_differences():
    a = record("posaug", 42, [[(4, 4), (4, 4), (0, 4), (4, 4)]])
    b = record("baseline", 42, [[(4, 4), (0, 4), (0, 4), (0, 4)]])
    delta, se, paired = seed_difference(a, b)
    d = [0, 1, 0, 1]
    assert paired and delta == pytest.approx(0.5) and se == pytest.approx(statistics.stdev(d) / 2)


def test_paired_se_is_smaller_than_the_independent_one_when_both_miss_the_same_examples():
    shared = [(4, 4)] * 50 + [(0, 4)] * 50
    a = record("posaug", 42, [shared[:60] + [(4, 4)] * 5 + shared[65:]])
    b = record("baseline", 42, [shared])
    _, paired_se, _ = seed_difference(a, b)
    x, y = a["lengths"][1], b["lengths"][1]
    assert paired_se < math.hypot(x["se"], y["se"]) / 3


def test_per_token_difference_equals_the_difference_of_the_tables_per_token_accuracies():
    a = record("posaug", 42, [[(3, 5), (5, 5), (1, 3)], [(2, 2), (0, 2)]])
    b = record("baseline", 42, [[(1, 5), (5, 5), (3, 3)], [(1, 2), (1, 2)]])
    delta, _, paired = seed_difference(a, b, "token_accuracy")
    expected = statistics.mean(x["token_accuracy"] - y["token_accuracy"]
                               for x, y in zip(a["lengths"][1:], b["lengths"][1:]))
    assert paired and delta == pytest.approx(expected)


def test_only_unseen_lengths_count():
    a = record("posaug", 42, [[(4, 4)]], seen_right=0)
    b = record("baseline", 42, [[(4, 4)]], seen_right=4)
    assert seed_difference(a, b)[0] == 0.0


def test_records_without_per_example_scores_compare_unpaired_with_independent_binomial_ses():
    a = record("posaug", 42, [[(4, 4), (0, 4)]], with_examples=False)
    b = record("baseline", 42, [[(0, 4), (0, 4)]])
    delta, se, paired = seed_difference(a, b)
    assert not paired and delta == 0.5 and se == pytest.approx(math.sqrt(0.25 / 2))


def test_records_evaluated_at_different_lengths_are_refused_naming_both_methods():
    a = record("posaug", 42, [[(4, 4)]])
    b = record("baseline", 42, [[(4, 4)]])
    b["lengths"][1]["length"] = 7
    with pytest.raises(ValueError, match="posaug and baseline were evaluated at different lengths"):
        seed_difference(a, b)


def _clear_win(seed: int, extra: int) -> list[dict]:
    return [record("posaug", seed, [[(4, 4)] * (60 + extra) + [(0, 4)] * (40 - extra)]),
            record("baseline", seed, [[(4, 4)] * 20 + [(0, 4)] * 80])]


def test_a_large_paired_difference_is_a_win_and_its_mirror_a_loss():
    records = _clear_win(42, 0)
    assert versus(records, "copy", "posaug", "baseline")["verdict"] == "higher"
    assert versus(records, "copy", "baseline", "posaug")["verdict"] == "lower"


def test_a_difference_within_the_seed_spread_is_a_tie_even_when_each_seed_is_significant():
    records = [record("posaug", 42, [[(4, 4)] * 90 + [(0, 4)] * 10]),
               record("baseline", 42, [[(4, 4)] * 20 + [(0, 4)] * 80]),
               record("posaug", 137, [[(4, 4)] * 2 + [(0, 4)] * 98]),
               record("baseline", 137, [[(4, 4)] * 22 + [(0, 4)] * 78])]
    result = versus(records, "copy", "posaug", "baseline")
    assert result["seeds"] == 2 and result["seed_se"] > result["se"]
    assert result["verdict"] == "no significant difference"


def test_seeds_combine_as_the_mean_of_per_seed_differences():
    records = _clear_win(42, 0) + _clear_win(137, 10)
    result = versus(records, "copy", "posaug", "baseline")
    assert result["delta"] == pytest.approx((0.4 + 0.5) / 2)
    assert result["seed_se"] == pytest.approx(statistics.stdev([0.4, 0.5]) / math.sqrt(2))


def test_the_former_name_of_the_baseline_pairs_like_the_current_one():
    records = _clear_win(42, 0)
    records[1]["method"] = "rope"
    assert versus(records, "copy", "posaug", "baseline")["delta"] == pytest.approx(0.4)


def test_tasks_whose_baseline_missed_the_gate_get_no_verdict():
    records = _clear_win(42, 0) + [record("posaug", 42, [[(4, 4)]], task="sort"),
                                   record("baseline", 42, [[(4, 4)]], task="sort", seen_right=0)]
    results = versus_all(records, aggregate(records), ["baseline", "posaug"])
    assert set(results["accuracy"]["baseline"]) == {"copy"}


def test_the_report_section_tallies_wins_losses_and_ties_per_row():
    records = _clear_win(42, 0) + [record("prope", 42, [[(4, 4)] * 60 + [(0, 4)] * 40])]
    section = versus_section(records, aggregate(records), ["baseline", "posaug", "prope"])
    assert "| baseline | **+40.0 ± 4.9 wins** | 1 / 0 / 0 |" in section
    assert "| prope | +0.0 ± 0.0 ties | 0 / 0 / 1 |" in section


def test_the_report_section_says_so_when_posaug_did_not_run():
    records = _clear_win(42, 0)[1:]
    assert "posaug was not in this run." in versus_section(records, aggregate(records), ["baseline"])
