"""`python -m pretrain runs` on a run whose status.json is damaged (issue 23): it says so and what the state is
inferred from (checkpoints, run lock), and touches no file. One tiny synthetic training run (~10-40 s loaded)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, TINY_TRAIN, file_hashes, run_train
from pretrain.experiments.runs import main as runs_main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # the fixture trains


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    run_train([*TINY_TRAIN, "data.synthetic=true", "optimizer.lr_warmup_iters=1", "schedule.train_iters=2",
               f"checkpoint.save={run_dir}"])
    return run_dir


@pytest.fixture
def run_dir(finished_run, tmp_path):
    copy = tmp_path / "runs" / "run"
    shutil.copytree(finished_run, copy)
    return copy


def listed(run_dir, capsys) -> str:
    before = file_hashes(run_dir)
    assert runs_main([str(run_dir.parent)]) == 0
    assert file_hashes(run_dir) == before, "runs only reads"
    return capsys.readouterr().out.splitlines()[1]


def test_truncated_status_of_a_finished_run_says_it_is_damaged_and_infers_finished(run_dir, capsys):
    status = run_dir / "status.json"
    status.write_text(status.read_text()[:20])
    line = listed(run_dir, capsys)
    assert " finished " in line
    assert "status.json is damaged (not valid JSON (truncated or overwritten))" in line
    assert "state inferred from the checkpoints (newest complete: iteration 2 of 2)" in line


def test_empty_status_of_an_unfinished_run_is_failed_from_the_checkpoints_and_the_lock(run_dir, capsys):
    (run_dir / "status.json").write_text("")
    shutil.rmtree(run_dir / "iter_0000002")
    line = listed(run_dir, capsys)
    assert " failed " in line and "status.json is damaged (empty)" in line
    assert "iteration 0 of 2" in line and "run lock (pid" in line and "gone): not finished, not running" in line


def test_status_without_a_known_state_is_reported_damaged(run_dir, capsys):
    (run_dir / "status.json").write_text('{"state": "bogus"}')
    line = listed(run_dir, capsys)
    assert " finished " in line and "status.json is damaged (holds no known state" in line


def test_a_damaged_last_checkpoint_is_called_damaged_naming_the_file_not_missing(run_dir):
    state = json.loads((run_dir / "iter_0000002" / "train_state.json").read_text())
    name, record = next((n, r) for n, r in sorted(state["files"].items()) if r["bytes"] > 100)
    with open(run_dir / "iter_0000002" / name, "r+b") as handle:
        handle.truncate(record["bytes"] // 2)
    before = file_hashes(run_dir)
    proc = subprocess.run([sys.executable, "-m", "pretrain", "runs", str(run_dir.parent)], cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert file_hashes(run_dir) == before, "runs only reads"
    line = proc.stdout.splitlines()[1]
    assert " failed " in line and "checkpoint is missing" not in line, line
    assert f"its last checkpoint iter_0000002 is damaged ({name} has {record['bytes'] // 2} of its " in line, line
