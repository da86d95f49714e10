"""pretrain/preflight.py: the launchers' plan and pre-flight in one interpreter, each outcome recorded apart.

slurm/common_checks.sh reads RESULTS_DIR/plan.rc, preflight.rc and preflight.out; what each outcome means (a plan
that does not fit can be overridden, a pre-flight refusal cannot) stays the launcher's, tested by tests/slurm/."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO

PLAN = ["--plan", "42m_posaug", "--gpu", "h100-80gb", "--nodes", "1", "--gpus-per-node", "4", "--check",
        "--set", "data.synthetic=true"]
TRAIN = ["--train", "--config", "42m_posaug", "--set", "data.synthetic=true", "parallel.use_distributed_optimizer=false"]


def preflight(results, *args: str, world_size: int = 4) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore", WORLD_SIZE=str(world_size))
    return subprocess.run([sys.executable, "-m", "pretrain.preflight", str(results), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_one_process_prints_the_plan_and_records_both_outcomes(tmp_path):
    proc = preflight(tmp_path, *PLAN, *TRAIN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "peak" in proc.stdout and "fits" in proc.stdout
    assert (tmp_path / "plan.rc").read_text() == "0\n" and (tmp_path / "preflight.rc").read_text() == "0\n"
    assert (tmp_path / "preflight.out").read_text().strip().splitlines()[-1] == (
        "check: config, data and layout are fine for 4 rank(s)")


def test_a_plan_that_does_not_fit_and_a_refused_preflight_are_recorded_apart(tmp_path):
    proc = preflight(tmp_path, *PLAN, "schedule.micro_batch_size=512", *TRAIN, "model.seq_length=0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "plan.rc").read_text() == "2\n"
    assert "plan: " in proc.stderr  # the plan's one-line refusal, on the terminal as before
    assert (tmp_path / "preflight.rc").read_text() == "2\n"
    assert "model.seq_length" in (tmp_path / "preflight.out").read_text()


def test_without_plan_only_the_preflight_runs(tmp_path):
    proc = preflight(tmp_path, *TRAIN, world_size=1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "plan.rc").exists() and proc.stdout == ""
    assert "fine for 1 rank(s)" in (tmp_path / "preflight.out").read_text()


def test_a_command_line_without_train_is_one_line_and_exit_2(tmp_path):
    proc = preflight(tmp_path, *PLAN)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: usage: python -m pretrain.preflight RESULTS_DIR [--plan ARGS ...] --train ARGS ..."]
