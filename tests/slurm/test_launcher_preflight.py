"""The launchers check before anything queues, on the real local SLURM cluster (slurm/local/start.sh).

`bash slurm/pretrain_<size>_<method>.sh` outside a job is the submit path: it checks the config, the data
prefix, the tokenizer against model.vocab_size and the plan's memory fit, and only then runs sbatch with
the same arguments. Every refusal here is one line, exit 2, and leaves the queue without a job of the
unique name each test gives (SBATCH_JOB_NAME). With valid data the same path submits the launcher with the
same arguments (and the layout it checked), and the job trains. A plain `sbatch` of the same launcher still
starts, and ends in its first seconds with the same refusal, before any model is built.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # real SLURM daemons

REPO = Path(__file__).resolve().parents[2]
SLURM = REPO / "slurm"
LOCAL_DIR = os.environ.get("SLURM_LOCAL_DIR", "/var/lib/slurm-local")
CPU_JOB = ["--gpus-per-node=0", "--ntasks-per-node=1", "--cpus-per-task=1", "--time=10"]  # > the USR1 lead
# A two-step run of a tiny model on the 10m launcher (its CPU mode adds the local implementation and FP32).
TINY_SETS = ["model.num_layers=2", "model.hidden_size=64", "model.ffn_hidden_size=128", "model.num_attention_heads=4",
             "model.num_query_groups=4", "model.seq_length=32", "model.vocab_size=512", "schedule.global_batch_size=4",
             "schedule.micro_batch_size=1", "optimizer.lr_warmup_iters=1", "schedule.train_iters=2",
             "logging.log_interval=1", "logging.eval_iters=1"]


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


def final_state(job: str, timeout: float) -> str:
    """The job's state once it has ended (scancel'd and reported as TIMEOUT-WAITING if it has not in `timeout` s)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        show = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=60,
                              env=job_env()).stdout
        state = re.search(r"JobState=(\w+)", show)
        if state and state.group(1) not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED"):
            return state.group(1)
        time.sleep(2)
    subprocess.run(["scancel", job], timeout=60, env=job_env())
    return "TIMEOUT-WAITING"


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


def test_submit_path_with_valid_data_submits_the_same_launcher_and_arguments_and_the_job_trains(cluster, tiny_shards,
                                                                                                tmp_path):
    # GPUS_PER_NODE=0 and CPUS_PER_TASK=1: the layout checked is the one submitted (the local node has 2 CPUs)
    proc, name = submit("pretrain_10m_posaug.sh", "--set", *TINY_SETS, DATA_PREFIX=tiny_shards,
                        OUTPUT_DIR=str(tmp_path / "runs"), GPUS_PER_NODE="0", CPUS_PER_TASK="1",
                        SBATCH_TIMELIMIT="10", SBATCH_OUTPUT=f"{tmp_path}/job-%j.out")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (f"checks passed: submitting sbatch --gpus-per-node=0 --cpus-per-task=1 {SLURM / 'pretrain_10m_posaug.sh'}"
            f" --set {' '.join(TINY_SETS)}") in proc.stdout
    job = re.search(r"^Submitted batch job (\d+)$", proc.stdout, re.M).group(1)
    assert queued(name) in ([job], [])  # queued under the caller's name (or already finished)
    state = final_state(job, 420)
    log = (tmp_path / f"job-{job}.out").read_text()
    assert state == "COMPLETED", f"{state}:\n{log[-4000:]}"
    assert f"==== 10m posaug (job {job}) ====" in log and "device          cpu (0 GPUs/node, backend gloo)" in log
    command = next(line for line in log.splitlines() if line.startswith("[posaug-slurm] command:"))
    assert command.split()[-len(TINY_SETS):] == TINY_SETS  # the launcher arguments reached the job, last
    assert f"data.data_path={tiny_shards}" in command
    assert "training step exited with code 0" in log and "step 2/2 | loss" in log
