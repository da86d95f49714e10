"""Launchers run the plan before srun: a layout that fits starts, one that does not is refused (exit 2)."""

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "slurm" / "pretrain_1b_posaug.sh"


def dry_run(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    import os
    import sys

    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    # synthetic data: without data a dry run ends with the pre-flight refusal (exit 2)
    env = {**keep, "PYTHON": sys.executable, "PRETRAIN_PLAN_CACHE": str(tmp_path / "cache"), "SYNTHETIC_DATA": "1",
           **env}
    return subprocess.run(["bash", str(LAUNCHER), "--dry-run", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("plan")


def test_dry_run_prints_the_plan_of_its_layout_and_starts_when_it_fits(tmp):
    result = dry_run(tmp)
    assert result.returncode == 0, result.stderr
    assert "plan: 1b_posaug_seed42 on 32 x NVIDIA H100 SXM 80GB (4 node(s) x 8 GPUs)" in result.stdout
    assert "(stage 0): fits" in result.stdout


def test_dry_run_refuses_a_layout_that_does_not_fit_naming_the_setting(tmp):
    result = dry_run(tmp, NNODES="1", GPUS_PER_NODE="1", TASKS_PER_NODE="1", PLAN_GPU="a100-40gb",
                     OVERRIDES="schedule.micro_batch_size=32")
    assert result.returncode == 2
    assert "DOES NOT FIT" in result.stdout
    assert "micro-batch" in result.stderr and "--no-plan-check" in result.stderr


def test_no_plan_check_starts_anyway_with_a_warning(tmp):
    result = dry_run(tmp, "--no-plan-check", NNODES="1", GPUS_PER_NODE="1", TASKS_PER_NODE="1", PLAN_GPU="a100-40gb",
                     OVERRIDES="schedule.micro_batch_size=32")
    assert result.returncode == 0, result.stderr
    assert "starting anyway (--no-plan-check)" in result.stdout
