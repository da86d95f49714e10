"""The launchers' pre-flight fails closed: a pre-flight (or plan) that cannot run or crashes stops the launcher with
exit 2 and one line, unless SKIP_PREFLIGHT=1 says to go on, which the launcher then says. Through the real launcher
script in dry-run mode (no cluster needed), with a real Python that cannot run the check: the system interpreter,
which has no torch and no numpy (as on a login node whose container holds the project's Python)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "slurm" / "pretrain_10m_posaug.sh"


def python_without_torch() -> str:
    """A real interpreter on this machine that cannot import numpy (the check, torch-free, crashes in it)."""
    for candidate in ("/usr/bin/python3", shutil.which("python3") or ""):
        if candidate and os.access(candidate, os.X_OK) and subprocess.run(
                [candidate, "-c", "import numpy"], capture_output=True).returncode != 0:
            return candidate
    pytest.skip("every python3 here has numpy: no interpreter in which the pre-flight crashes")


def dry_run(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SKIP_PREFLIGHT"))}
    env.update(PYTHON=python_without_torch(), PYTHONPATH=str(REPO), DATA_PREFIX=str(tmp_path / "owt"),
               OUTPUT_DIR=str(tmp_path / "runs"), **extra)
    return subprocess.run(["bash", str(LAUNCHER), "--dry-run"], capture_output=True, text=True, timeout=120, env=env)


def one_stderr_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_a_crashing_preflight_stops_the_launcher_with_exit_2_and_one_line(tmp_path):
    line = one_stderr_line(dry_run(tmp_path, GPUS_PER_NODE="0"))  # a CPU job: no plan, only the pre-flight
    assert "the pre-flight check could not run" in line and "No module named 'numpy'" in line
    assert "SKIP_PREFLIGHT=1" in line


def test_a_crashing_plan_stops_a_gpu_launcher_with_exit_2_and_one_line(tmp_path):
    line = one_stderr_line(dry_run(tmp_path))
    assert "the plan could not run" in line and "No module named 'numpy'" in line and "SKIP_PREFLIGHT=1" in line


def test_skip_preflight_continues_past_a_crashing_preflight_and_says_so(tmp_path):
    proc = dry_run(tmp_path, SKIP_PREFLIGHT="1")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    warnings = [line for line in proc.stdout.splitlines() if "continuing without it because SKIP_PREFLIGHT=1" in line]
    assert any("the pre-flight check could not run" in line for line in warnings), proc.stdout[-3000:]
    assert any("the plan could not run" in line for line in warnings), proc.stdout[-3000:]
