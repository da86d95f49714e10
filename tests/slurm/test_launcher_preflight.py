"""The launchers check before anything queues, on the real local SLURM cluster (slurm/local/start.sh).

`bash slurm/pretrain_<size>_<method>.sh` outside a job is the submit path: it checks the config, the data
prefix, the tokenizer against model.vocab_size and the plan's memory fit, and only then runs sbatch with
the same arguments. Every refusal here is one line, exit 2, and leaves the queue without a job of the
unique name each test gives (SBATCH_JOB_NAME). A plain `sbatch` of the same launcher still starts, and
ends in its first seconds with the same refusal, before any model is built.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # real SLURM daemons

REPO = Path(__file__).resolve().parents[2]
SLURM = REPO / "slurm"
LOCAL_DIR = os.environ.get("SLURM_LOCAL_DIR", "/var/lib/slurm-local")
CPU_JOB = ["--gpus-per-node=0", "--ntasks-per-node=1", "--cpus-per-task=1", "--time=10"]  # > the USR1 lead


def job_env(**extra: str) -> dict:
    """This environment minus an outer job's SLURM_* variables, pointed at the local cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env.update(SLURM_CONF=f"{LOCAL_DIR}/etc/slurm.conf", PYTHON=sys.executable, PYTHONWARNINGS="ignore",
               PYTHONPATH=str(REPO))
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def cluster():
    """Start (or reuse) the local cluster via the real script."""
    result = subprocess.run(["bash", str(SLURM / "local" / "start.sh")], capture_output=True, text=True,
                            timeout=600, env=job_env())
    assert result.returncode == 0, result.stdout + result.stderr


def queued(name: str) -> list[str]:
    """Jobs of this name in the local cluster's queue (any state)."""
    proc = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True, timeout=60,
                          env=job_env())
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def submit(launcher: str, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, str]:
    """`bash slurm/<launcher> args` outside a job, under a unique job name; (the process, that name)."""
    name = f"preflight-{uuid.uuid4().hex[:8]}"
    proc = subprocess.run(["bash", str(SLURM / launcher), *args], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env=job_env(SBATCH_JOB_NAME=name, **env))
    return proc, name


def refused(proc: subprocess.CompletedProcess, name: str) -> str:
    """The one-line refusal, after checking exit 2 and an empty queue."""
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert queued(name) == []
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_submit_path_refuses_a_missing_data_prefix_and_queues_nothing(cluster):
    line = refused(*submit("pretrain_10m_posaug.sh"))
    assert "refused before submitting (nothing queued)" in line and "data.data_path is missing" in line


def test_submit_path_refuses_an_empty_data_prefix(cluster, tmp_path):
    (tmp_path / "shards").mkdir()
    line = refused(*submit("pretrain_10m_posaug.sh", DATA_PREFIX=str(tmp_path / "shards" / "owt")))
    assert f"no manifest for '{tmp_path / 'shards' / 'owt'}'" in line


def test_submit_path_refuses_a_tokenizer_larger_than_the_models_vocabulary(cluster, tiny_shards):
    line = refused(*submit("pretrain_10m_posaug.sh", "--set", "model.vocab_size=256", DATA_PREFIX=tiny_shards))
    # the config's own check (TrainConfig.validate) names both numbers and the fix before the launcher's runs
    assert "model.vocab_size is 256" in line and "512-token tokenizer" in line and "set model.vocab_size=512" in line


def test_submit_path_refuses_a_config_that_does_not_fit(cluster, tiny_shards):
    proc, name = submit("pretrain_10m_posaug.sh", DATA_PREFIX=tiny_shards, NNODES="1", GPUS_PER_NODE="1",
                        TASKS_PER_NODE="1", PLAN_GPU="a100-40gb", OVERRIDES="schedule.micro_batch_size=128")
    assert proc.returncode == 2 and queued(name) == []
    assert "DOES NOT FIT" in proc.stdout and "the plan refuses this run" in proc.stderr


def test_the_dry_run_prints_the_command_then_refuses_as_the_submit_path_does(tmp_path):
    (tmp_path / "shards").mkdir()
    proc = subprocess.run(["bash", str(SLURM / "pretrain_10m_posaug.sh"), "--dry-run"], capture_output=True,
                          text=True, timeout=300, env=job_env(DATA_PREFIX=str(tmp_path / "shards" / "owt")))
    assert "[posaug-slurm] command: srun " in proc.stdout
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "refused before submitting (dry run, nothing queued)" in lines[0]
    assert f"no manifest for '{tmp_path / 'shards' / 'owt'}'" in lines[0]
    assert "data_prep build --data-prefix" in lines[0]


def test_plain_sbatch_without_data_ends_with_the_refusal_before_building_the_model(cluster, tmp_path):
    proc = subprocess.run(["timeout", "240", "sbatch", "--wait", "--parsable", f"--output={tmp_path}/job-%j.out",
                           *CPU_JOB, str(SLURM / "pretrain_10m_posaug.sh")], capture_output=True, text=True,
                          timeout=250, cwd=tmp_path, env=job_env(OUTPUT_DIR=str(tmp_path / "runs")))
    job = proc.stdout.strip().split(";")[0]
    log = (tmp_path / f"job-{job}.out").read_text()
    assert proc.returncode == 2, log[-3000:]
    assert "refused before building the model: error: data.data_path is missing" in log
    assert "training step exited" not in log and not (tmp_path / "runs").exists()  # srun never started
