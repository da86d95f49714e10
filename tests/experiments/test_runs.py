"""`python -m pretrain runs` and `eval all` on a directory holding finished, running and failed runs
(real training processes; the running one is killed at the end). ~2-3 min on 2 loaded cores."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, TINY_TRAIN, run_train
from pretrain.evaluation.cli import eval_cli
from pretrain.experiments.runs import main as runs_main
from pretrain.runs import discover

pytestmark = [pytest.mark.slow]  # real training processes

ENV = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")


def _wait_for(predicate, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError("timed out")


def _status(run_dir):
    try:
        return json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


@pytest.fixture(scope="module")
def grid(tiny_shards, tmp_path_factory):
    """root/{baseline_s1, posaug_s1} finished, root/crashed failed (non-finite updates), root/live running."""
    root = tmp_path_factory.mktemp("grid")
    common = [*TINY_TRAIN, f"data.data_path={tiny_shards}", "schedule.train_iters=3", "logging.eval_iters=1"]
    for name, strategy in (("baseline_s1", "none"), ("posaug_s1", "posaug")):
        run_train([*common, f"positions.strategy={strategy}", "seed=1", f"checkpoint.save={root / name}"])
    crashed = run_train([*common, "schedule.train_iters=20", "optimizer.lr=1e6", "optimizer.min_lr=1e6",
                         "optimizer.clip_grad=0", f"checkpoint.save={root / 'crashed'}"], check=False)
    assert crashed.returncode != 0
    live = subprocess.Popen([sys.executable, "-m", "pretrain", "train", "--set", *common, "schedule.train_iters=100000",
                             "logging.log_interval=1", f"checkpoint.save={root / 'live'}"],
                            cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: _status(root / "live").get("iteration", 0) >= 1)
        # Alive, holding its lock and its status "running", as a run between two steps is; stopped, it neither
        # burns a core for the module's length nor changes its files under the tests that copy them.
        live.send_signal(signal.SIGSTOP)
        yield root, live
    finally:
        live.kill()
        live.wait(timeout=30)


def test_runs_lists_size_method_seed_iteration_and_state(grid, capsys):
    root, _ = grid
    assert runs_main([str(root)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:-1]}
    assert rows["baseline_s1"][1:6] == ["tiny", "baseline", "1", "3/3", "finished"]
    assert rows["posaug_s1"][1:6] == ["tiny", "posaug", "1", "3/3", "finished"]
    assert rows["crashed"][5] == "failed" and "TrainingStopped" in out
    assert rows["live"][5] == "running"
    assert out.splitlines()[-1] == "2 finished, 1 running, 1 failed (4 runs)"


def test_a_run_whose_process_died_without_a_word_is_failed(grid, tmp_path):
    root, live = grid
    import shutil

    shutil.copytree(root / "live", tmp_path / "killed", ignore=shutil.ignore_patterns("tensorboard"))
    status = _status(tmp_path / "killed")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    (tmp_path / "killed" / "status.json").write_text(json.dumps(dict(status, pid=dead.pid)))
    (run,) = discover(tmp_path)
    assert run.state == "failed" and "is gone" in run.detail


def test_runs_on_a_missing_directory_is_one_line_and_exit_2(tmp_path, capsys):
    assert runs_main([str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_eval_all_evaluates_only_finished_runs_and_a_rerun_reuses_them(grid, capsys):
    root, _ = grid
    args = ["all", str(root), "--lengths", "64", "--num-spans", "2", "--no-progress"]
    assert eval_cli(args) == 0
    first = capsys.readouterr().out
    assert "2 to evaluate, 0 evaluated already, 2 not finished" in first
    records = {p.name: json.loads(p.read_text()) for p in (root / "eval_records").glob("*.json")}
    assert set(records) == {"baseline_s1.json", "posaug_s1.json"}
    assert records["posaug_s1.json"]["size"] == "tiny" and records["posaug_s1.json"]["method"] == "posaug"
    assert "cliff" in records["posaug_s1.json"]["lengths"]["64"]
    assert eval_cli(args) == 0
    assert "0 to evaluate, 2 evaluated already" in capsys.readouterr().out
    assert eval_cli([*args[:3], "32,64", *args[4:]]) == 0  # a new length: evaluated again
    assert "2 to evaluate" in capsys.readouterr().out


def test_eval_report_over_eval_all_records_compares_with_the_baseline(grid, tmp_path, capsys):
    root, _ = grid
    assert eval_cli(["all", str(root), "--lengths", "64", "--num-spans", "2", "--no-progress"]) == 0
    assert eval_cli(["report", str(root / "eval_records"), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| tiny | baseline | 1 | (baseline) |" in out and "| tiny | posaug | 1 |" in out
