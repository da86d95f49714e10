"""`eval all DIR --downstream`: lm-eval scores for every finished run, resumable without recomputing,
then `eval report`'s downstream table. Two tiny runs, local task files, no download (~1-2 min)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from downstream_helpers import MC_TASK, PPL_TASK, make_finished_run, offline_env, write_tasks  # noqa: E402

pytest.importorskip("lm_eval", reason="the eval extra (lm-eval) is not installed")

from pretrain.evaluation import downstream, eval_cli  # noqa: E402

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def grid(megatron_world, tiny_shards, tmp_path_factory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        offline_env(monkeypatch, tmp_path_factory.mktemp("datasets_cache"))
        root = tmp_path_factory.mktemp("grid")
        for name, strategy in (("baseline_s1", "none"), ("posaug_s1", "posaug")):
            make_finished_run(root / name, tiny_shards, strategy)
        yield root, write_tasks(tmp_path_factory.mktemp("tasks"))


@pytest.fixture
def calls(monkeypatch):
    """Every lm-eval run (the real one) as (run, tasks)."""
    seen, real = [], downstream.evaluate_downstream

    def counted(source, tasks, **kwargs):
        seen.append((Path(source).name, list(tasks)))
        return real(source, tasks, **kwargs)

    monkeypatch.setattr(downstream, "evaluate_downstream", counted)
    return seen


def _all(root, tasks_dir, tasks):
    return eval_cli(["all", str(root), "--lengths", "64", "--num-spans", "2", "--no-progress",
                     "--downstream", tasks, "--include-path", str(tasks_dir)])


def _records(root):
    return {p.stem: json.loads(p.read_text()) for p in (root / "eval_records").glob("*.json")}


def test_eval_all_downstream_scores_every_finished_run_and_a_rerun_recomputes_nothing(grid, calls, capsys):
    root, tasks_dir = grid
    assert _all(root, tasks_dir, MC_TASK) == 0
    assert sorted(calls) == [("baseline_s1", [MC_TASK]), ("posaug_s1", [MC_TASK])]
    records = _records(root)
    for name in ("baseline_s1", "posaug_s1"):
        entry = records[name]["downstream"][MC_TASK]
        assert entry["iteration"] == 2 and 0 <= entry["acc_norm"] <= 1 and Path(entry["results_file"]).is_file()
        assert Path(entry["results_file"]).parent == root / name / "downstream"
    files = {p: p.stat().st_mtime_ns for p in root.glob("*/downstream/*.json")}
    capsys.readouterr()
    calls.clear()
    assert _all(root, tasks_dir, MC_TASK) == 0
    assert calls == []
    assert f"downstream {MC_TASK}: 0 runs to evaluate, 2 done already" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in root.glob("*/downstream/*.json")} == files
    assert _records(root) == records


def test_a_new_task_runs_only_that_task_and_keeps_the_earlier_scores(grid, calls):
    root, tasks_dir = grid
    assert _all(root, tasks_dir, MC_TASK) == 0
    calls.clear()
    assert _all(root, tasks_dir, f"{MC_TASK},{PPL_TASK}") == 0
    assert sorted(calls) == [("baseline_s1", [PPL_TASK]), ("posaug_s1", [PPL_TASK])]
    for record in _records(root).values():
        assert set(record["downstream"]) == {MC_TASK, PPL_TASK}
        assert record["downstream"][PPL_TASK]["word_perplexity"] > 1


def test_loss_reevaluation_keeps_the_downstream_scores_of_the_same_checkpoint(grid, calls):
    root, tasks_dir = grid
    assert _all(root, tasks_dir, MC_TASK) == 0
    calls.clear()
    assert eval_cli(["all", str(root), "--lengths", "32,64", "--num-spans", "2", "--no-progress",
                     "--downstream", MC_TASK, "--include-path", str(tasks_dir)]) == 0
    assert calls == []
    for record in _records(root).values():
        assert "32" in record["lengths"] and MC_TASK in record["downstream"]


def test_eval_report_shows_accuracy_and_delta_vs_the_baseline(grid, tmp_path, capsys):
    root, tasks_dir = grid
    assert _all(root, tasks_dir, MC_TASK) == 0
    capsys.readouterr()
    assert eval_cli(["report", str(root / "eval_records"), "--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"| size | method | n | {MC_TASK} acc_norm | Δ {MC_TASK} |" in out
    assert "| tiny | baseline | 1 |" in out and "(baseline) |" in out
    assert f"Δ {MC_TASK}" in (tmp_path / "summary.md").read_text()
    assert f"{MC_TASK}/acc_norm_mean" in (tmp_path / "summary.csv").read_text()
