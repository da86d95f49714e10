"""`eval report` downstream columns: per size, accuracy ± stderr and Δ vs the baseline of that size.
Hand-made records; < 1 s."""

import math

import pytest

from pretrain.evaluation.downstream_report import done_tasks, downstream_table
from pretrain.evaluation.report import downstream_metrics
from pretrain.evaluation.report import aggregate


def _record(size, method, seed, acc_norm, se, params, acc=None):
    entry = {"acc_norm": acc_norm, "acc_norm_stderr": se, "iteration": 10, "num_fewshot": None, "limit": None}
    if acc is not None:
        entry.update(acc=acc, acc_stderr=se)
    return {"run": f"{size}_{method}_s{seed}", "label": f"{size}_{method}", "size": size, "method": method,
            "seed": seed, "parameters": params, "train_window": 64, "lengths": {},
            "downstream": {"hellaswag": entry}}


RECORDS = [_record("10m", "baseline", 1, 0.30, 0.03, 10e6, acc=0.25), _record("10m", "baseline", 2, 0.32, 0.04, 10e6),
           _record("10m", "posaug", 1, 0.33, 0.03, 10e6),
           _record("113m", "baseline", 1, 0.40, 0.02, 113e6), _record("113m", "posaug", 1, 0.38, 0.02, 113e6)]


def _cells():
    lines = downstream_table(RECORDS, baseline="baseline").splitlines()
    return lines[0], {(c[1], c[2]): c[3:] for c in ([x.strip() for x in line.split("|")] for line in lines[2:])}


def test_header_names_each_tasks_accuracy_and_its_delta():
    header, _ = _cells()
    assert header == "| size | method | n | hellaswag acc_norm | Δ hellaswag |"


def test_accuracy_is_the_mean_over_seeds_with_the_stderr_of_that_mean():
    _, cells = _cells()
    se = math.sqrt(0.03 ** 2 + 0.04 ** 2) / 2
    assert cells[("10m", "baseline")][:3] == ["2", f"{0.31:.3f} ± {se:.3f}", "(baseline)"]


def test_delta_is_against_the_baseline_of_the_same_size_with_combined_stderr():
    _, cells = _cells()
    base_se = math.sqrt(0.03 ** 2 + 0.04 ** 2) / 2
    assert cells[("10m", "posaug")][2] == f"{0.33 - 0.31:+.3f} ± {math.hypot(0.03, base_se):.3f}"
    assert cells[("113m", "posaug")][2] == f"{-0.02:+.3f} ± {math.hypot(0.02, 0.02):.3f}"


def test_rows_go_from_small_to_large_with_the_baseline_first():
    lines = downstream_table(RECORDS, baseline="baseline").splitlines()[2:]
    assert [line.split("|")[1:3] for line in lines] == [[" 10m ", " baseline "], [" 10m ", " posaug "],
                                                         [" 113m ", " baseline "], [" 113m ", " posaug "]]


def test_a_size_without_a_baseline_gets_no_delta():
    table = downstream_table([_record("1b", "posaug", 1, 0.5, 0.01, 1e9)], baseline="baseline")
    assert table.splitlines()[2] == "| 1b | posaug | 1 | 0.500 ± 0.010 | — |"


def test_records_without_downstream_scores_give_no_table():
    assert downstream_table([{"run": "x", "lengths": {}}], baseline=None) == ""


def test_summary_csv_metrics_hold_every_downstream_score_as_mean_and_std_over_seeds():
    assert downstream_metrics(RECORDS[0]) == {"hellaswag/acc_norm": 0.30, "hellaswag/acc_norm_stderr": 0.03,
                                              "hellaswag/acc": 0.25, "hellaswag/acc_stderr": 0.03}
    rows = {(r["size"], r["method"]): r["metrics"] for r in aggregate(RECORDS, baseline="baseline")}
    mean, std = rows[("10m", "baseline")]["hellaswag/acc_norm"]
    assert mean == pytest.approx(0.31) and std == pytest.approx(math.sqrt(2) * 0.01)


def test_a_task_is_done_only_for_the_same_checkpoint_fewshot_and_limit():
    record = RECORDS[0]
    assert done_tasks(record, 10, None, None) == {"hellaswag"}
    assert done_tasks(record, 11, None, None) == set()
    assert done_tasks(record, 10, 5, None) == set()
    assert done_tasks(record, 10, None, 100) == set()
