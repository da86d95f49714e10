"""`reproduce --suite tasks --merge`: one report of suites run in parts (pretrain.tasks.merge); the report's
per-method deviations."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pretrain.tasks.evaluate import without_example_scores
from pretrain.tasks.merge import merge_reports
from pretrain.tasks.presets import PRESETS
from pretrain.tasks.report import write_report
from pretrain.tasks.versus import versus_all

from test_task_versus import record

REPO = Path(__file__).resolve().parents[2]
SEEDS = [42, 137]
METHODS = ("baseline", "posaug")
TIMING = {"train_cpu_s": 60.0, "train_runs_timed": 4, "eval_cpu_s": 6.0, "eval_runs_timed": 4, "runs": 4,
          "cores": 2, "wall_s": 40.0, "jobs": 2, "load_start": "0.1", "load_end": "0.2", "report_only": False,
          "invocations": [{"started": "2026-11-28 00:00:00 UTC", "wall_s": 40.0, "jobs": 2, "load_start": "0.1",
                           "load_end": "0.2", "runs_trained": 4}]}


def records(task: str) -> list[dict]:
    """Baseline and PosAug on `task`, both seeds; PosAug right on more unseen examples, by seed."""
    out = []
    for seed in SEEDS:
        extra = 2 if seed == 42 else 3
        out.append(record("baseline", seed, [[(4, 4)] * 2 + [(0, 4)] * 8], task=task))
        out.append(record("posaug", seed, [[(4, 4)] * (2 + extra) + [(0, 4)] * (8 - extra)], task=task))
    for r in out:
        r["train_lengths"] = list(PRESETS["cpu-long"].tasks[task])
    return out


def preset_of(tasks: list[str]):
    preset = PRESETS["cpu-long"]
    return dataclasses.replace(preset, tasks={t: preset.tasks[t] for t in tasks}, methods=METHODS)


def write_part(out: Path, tasks: list[str]) -> Path:
    """A suite's own report of `tasks`, as an invocation writes it; returns its results.json."""
    out.mkdir(parents=True, exist_ok=True)
    write_report(out, "cpu-long", preset_of(tasks), [r for t in tasks for r in records(t)], SEEDS, dict(TIMING))
    return out / "results.json"


def test_a_merged_report_ranks_and_pairs_as_one_report_of_every_task(tmp_path):
    first, second = write_part(tmp_path / "a", ["copy", "reverse"]), write_part(tmp_path / "b", ["addition"])
    merge_reports(tmp_path / "merged", [first, second])
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())
    every = [r for t in ("copy", "reverse", "addition") for r in records(t)]
    (tmp_path / "whole").mkdir()
    write_report(tmp_path / "whole", "cpu-long", preset_of(["copy", "reverse", "addition"]), every, SEEDS,
                 dict(TIMING))
    whole = json.loads((tmp_path / "whole" / "results.json").read_text())
    assert merged["ranking"] == whole["ranking"]
    assert merged["versus_posaug"] == whole["versus_posaug"]
    assert all(r["paired"] for r in merged["versus_posaug"]["accuracy"]["baseline"].values())


def test_a_merged_reports_records_keep_no_per_example_scores_yet_its_versus_stays_paired(tmp_path):
    merge_reports(tmp_path / "m", [write_part(tmp_path / "a", ["copy"]), write_part(tmp_path / "b", ["sort"])])
    merged = json.loads((tmp_path / "m" / "results.json").read_text())
    unpaired = versus_all(merged["records"], merged["summary"], list(METHODS))
    assert not unpaired["accuracy"]["baseline"]["copy"]["paired"]
    assert merged["versus_posaug"]["accuracy"]["baseline"]["copy"]["paired"]
    assert all(r["lengths"] == without_example_scores(r["lengths"]) for r in merged["records"])


def test_the_merged_report_names_its_parts_and_sums_their_invocations(tmp_path):
    first, second = write_part(tmp_path / "a", ["copy"]), write_part(tmp_path / "b", ["sort"])
    report = (merge_reports(tmp_path / "m", [first, second])).read_text()
    assert f"Merged from {first} (copy); {second} (sort)" in report
    assert "80.0 min" not in report and "1.3 min wall in 2 invocation(s) in the merged parts'" in report


def write_method_part(out: Path, tasks: list[str], method: str = "swa_hybrid") -> Path:
    """A suite's own report of one more method on `tasks`, run apart from the baseline and PosAug."""
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for task in tasks:
        for seed in SEEDS:
            rows.append(record(method, seed, [[(4, 4)] * 3 + [(0, 4)] * 7], task=task))
            rows[-1]["train_lengths"] = list(PRESETS["cpu-long"].tasks[task])
    preset = dataclasses.replace(preset_of(tasks), methods=(method,))
    write_report(out, "cpu-long", preset, rows, SEEDS, dict(TIMING))
    return out / "results.json"


def test_a_method_part_joins_a_stored_suite_as_new_rows_under_its_gate(tmp_path):
    stored = write_part(tmp_path / "a", ["copy", "sort"])
    report = merge_reports(tmp_path / "m", [stored, write_method_part(tmp_path / "b", ["copy", "sort"])])
    merged = json.loads((tmp_path / "m" / "results.json").read_text())
    assert merged["methods"] == ["baseline", "posaug", "swa_hybrid"]
    assert set(merged["summary"]["copy"]) == {"baseline", "posaug", "swa_hybrid"}
    assert "unpaired, marked so, for a row from another method part" in report.read_text()


def test_a_part_stored_under_a_methods_old_name_keeps_its_column(tmp_path):
    stored = write_part(tmp_path / "a", ["copy"])
    results = json.loads(stored.read_text())
    results["methods"] = ["rope" if m == "baseline" else m for m in results["methods"]]
    stored.write_text(json.dumps(results))
    report = merge_reports(tmp_path / "m", [stored, write_method_part(tmp_path / "b", ["copy"])]).read_text()
    assert "| Task | baseline | posaug | swa_hybrid |" in report


def test_posaug_against_a_row_from_another_method_part_is_unpaired_and_its_own_rows_stay_paired(tmp_path):
    stored = write_part(tmp_path / "a", ["copy"])
    merge_reports(tmp_path / "m", [stored, write_method_part(tmp_path / "b", ["copy"])])
    versus = json.loads((tmp_path / "m" / "results.json").read_text())["versus_posaug"]["accuracy"]
    assert versus["baseline"]["copy"]["paired"] and not versus["swa_hybrid"]["copy"]["paired"]
    assert versus["baseline"]["copy"] == json.loads(stored.read_text())["versus_posaug"]["accuracy"]["baseline"]["copy"]


def test_a_method_in_two_method_parts_is_refused(tmp_path):
    first = write_method_part(tmp_path / "a", ["copy"])
    second = write_part(tmp_path / "b", ["copy"])
    third = write_method_part(tmp_path / "c", ["copy"])
    with pytest.raises(ValueError, match="method swa_hybrid is in both"):
        merge_reports(tmp_path / "m", [first, second, third])


def test_parts_differing_in_both_methods_and_tasks_are_refused(tmp_path):
    first, second = write_part(tmp_path / "a", ["copy"]), write_method_part(tmp_path / "b", ["sort"])
    with pytest.raises(ValueError, match="methods and tasks both differ from the first part's"):
        merge_reports(tmp_path / "m", [first, second])


def test_a_task_in_two_parts_is_refused(tmp_path):
    first, second = write_part(tmp_path / "a", ["copy"]), write_part(tmp_path / "b", ["copy", "sort"])
    with pytest.raises(ValueError, match="task copy is in both"):
        merge_reports(tmp_path / "m", [first, second])


def test_parts_with_other_seeds_are_refused(tmp_path):
    first, second = write_part(tmp_path / "a", ["copy"]), write_part(tmp_path / "b", ["sort"])
    second.write_text(json.dumps({**json.loads(second.read_text()), "seeds": [42]}))
    with pytest.raises(ValueError, match=r"seeds \[42\] but the first part has \[42, 137\]"):
        merge_reports(tmp_path / "m", [first, second])


def test_a_part_trained_with_another_budget_than_the_preset_has_is_refused(tmp_path):
    first, second = write_part(tmp_path / "a", ["copy"]), write_part(tmp_path / "b", ["sort"])
    results = json.loads(second.read_text())
    results["budgets"]["sort"]["train_iters"] = 7
    second.write_text(json.dumps(results))
    with pytest.raises(ValueError, match="sort was trained with .* retrain that task"):
        merge_reports(tmp_path / "m", [first, second])


def test_the_merge_never_overwrites_an_input_or_a_suites_own_report(tmp_path):
    first, second = write_part(tmp_path / "a", ["copy"]), write_part(tmp_path / "b", ["sort"])
    before = first.read_text()
    with pytest.raises(ValueError, match="would overwrite the input"):
        merge_reports(tmp_path / "a", [first, second])
    write_part(tmp_path / "c", ["reverse"])
    with pytest.raises(ValueError, match="holds a suite's own report"):
        merge_reports(tmp_path / "c", [first, second])
    assert first.read_text() == before


def test_merging_again_into_the_merged_directory_rewrites_it(tmp_path):
    parts = [write_part(tmp_path / "a", ["copy"]), write_part(tmp_path / "b", ["sort"])]
    merge_reports(tmp_path / "m", parts)
    merge_reports(tmp_path / "m", parts)
    assert json.loads((tmp_path / "m" / "results.json").read_text())["merged_from"]


def test_merge_with_a_flag_that_selects_runs_is_one_line_and_exit_code_2(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-m", "pretrain", "reproduce", "--suite", "tasks", "--seeds", "42",
                           "--merge", "a.json", "b.json", "--output", str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("error: --merge takes preset, seeds, tasks and methods from its results.json "
                                   "files; drop --seeds")


def test_the_stored_eight_task_report_is_what_merge_writes_from_the_stored_parts(tmp_path, monkeypatch):
    stored = REPO / "benchmarks" / "results" / "tasks_cpu-long_methods_2seeds_eight_tasks.md"
    parts = [Path("benchmarks/results/tasks_cpu-long_methods_2seeds_results.json"),
             Path("benchmarks/results/tasks_cpu-long_methods_2seeds_addition_results.json")]
    monkeypatch.chdir(REPO)
    written = merge_reports(tmp_path, parts).read_text()
    # The stored copy links the parts' plots (the same pixels) instead of copies of its own.
    without_plots = [line for line in written.splitlines() if not line.startswith("![")]
    assert [line for line in stored.read_text().splitlines() if not line.startswith("![")] == without_plots


def test_the_pose_deviation_is_listed_only_when_pose_is_in_the_report(tmp_path):
    without = (tmp_path / "a" / "report.md")
    write_part(tmp_path / "a", ["copy"])
    with_pose = tmp_path / "b"
    with_pose.mkdir()
    pose_records = records("copy") + [{**r, "method": "pose"} for r in records("copy") if r["method"] == "posaug"]
    preset = dataclasses.replace(preset_of(["copy"]), methods=(*METHODS, "pose"))
    write_report(with_pose, "cpu-long", preset, pose_records, SEEDS, dict(TIMING))
    assert "PoSE cuts the padded training window" not in without.read_text()
    assert "PoSE cuts the padded training window" in (with_pose / "report.md").read_text()
