"""slurm/ scripts without a cluster: syntax, one launcher per table row, dry runs print the right command.

The same scripts are submitted for real to a local SLURM cluster in tests/slurm/test_slurm_cluster.py.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pretrain.table import SHIPPED_METHODS, TABLE1_SIZES

REPO = Path(__file__).resolve().parents[2]
SLURM = REPO / "slurm"
LAUNCHERS = [f"pretrain_{size}_{method}.sh" for size in TABLE1_SIZES for method in SHIPPED_METHODS]
# The launchers are one generated template (tests/experiments/test_generated_files.py pins each file to the
# generator), so a dry run per method, the sizes taken in turn, runs every method's and every size's part of it:
# one dry run per method, not one per launcher.
DRY_RUN_LAUNCHERS = [f"pretrain_{TABLE1_SIZES[i % len(TABLE1_SIZES)]}_{method}.sh"
                     for i, method in enumerate(SHIPPED_METHODS)]
ALL_SCRIPTS = sorted(str(p.relative_to(REPO)) for p in SLURM.rglob("*.sh"))


def clean_env(**extra: str) -> dict:
    """The caller's environment without SLURM job variables or launcher overrides (tests may run in a job); the
    launcher's Python is the one running the tests (PYTHON="" leaves the launcher to find one)."""
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "SBATCH_")) and k not in LAUNCHER_VARS}
    return {**keep, "PYTHON": sys.executable, **extra}


LAUNCHER_VARS = {"POSAUG_ROOT", "PYTHON", "CONFIG", "DATA_PREFIX", "SYNTHETIC_DATA", "OUTPUT_DIR", "RUN_NAME",
                 "RUN_DIR", "SEED", "SEEDS", "TP", "PP", "DP", "OVERRIDES", "CONTAINER_IMAGE", "CONTAINER_MOUNTS",
                 "TASKS_PER_NODE", "RDZV_PORT", "RDZV_ADDR", "MASTER_PORT", "MASTER_ADDR", "REQUEUE", "DRY_RUN", "NNODES", "GPUS_PER_NODE", "CPUS_PER_TASK",
                 "INPUT", "TOKENIZER", "OUTPUT_PREFIX", "NUM_SHARDS", "WORKERS", "DATA_PREP_ARGS"}


def run(args: list[str], cwd: Path = REPO, **env: str) -> subprocess.CompletedProcess:
    # 300 s: the first dry run of a size builds the plan's parameter-shape cache (a Megatron import).
    return subprocess.run(args, cwd=cwd, env=clean_env(**env), capture_output=True, text=True, timeout=300)


def dry_run(launcher: str, *args: str, cwd: Path = REPO, **env: str) -> subprocess.CompletedProcess:
    """A dry run; synthetic data unless DATA_PREFIX is given (without data the dry run refuses, exit 2)."""
    if "DATA_PREFIX" not in env:
        env.setdefault("SYNTHETIC_DATA", "1")
    return run(["bash", str(SLURM / launcher), "--dry-run", *args], cwd=cwd, **env)


def command_line(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith("[posaug-slurm] command:")]
    assert len(lines) == 1, stdout
    return lines[0]


@pytest.mark.parametrize("script", ALL_SCRIPTS)
def test_every_slurm_script_passes_bash_n(script):
    result = run(["bash", "-n", script])
    assert result.returncode == 0, result.stderr


def test_there_is_one_launcher_per_table1_size_and_method():
    present = sorted(p.name for p in SLURM.glob("pretrain_*.sh"))
    assert present == sorted(LAUNCHERS)


def test_the_dry_runs_cover_every_size_and_every_method():
    covered = [re.match(r"pretrain_(\w+?)_(\w+)\.sh", launcher).groups() for launcher in DRY_RUN_LAUNCHERS]
    assert {size for size, _ in covered} == set(TABLE1_SIZES)
    assert sorted(method for _, method in covered) == sorted(SHIPPED_METHODS)


@pytest.mark.parametrize("launcher", DRY_RUN_LAUNCHERS)
def test_dry_run_prints_an_srun_command_for_the_launchers_size_and_method(launcher):
    size, method = re.match(r"pretrain_(\w+?)_(\w+)\.sh", launcher).groups()
    result = dry_run(launcher)
    assert result.returncode == 0, result.stderr
    command = command_line(result.stdout)
    assert " srun " in command and "slurm/rank_env.sh" in command
    assert f"-m pretrain train --config {REPO}/pretrain/configs/{size}_{method}.yaml" in command
    assert f"name={size}_{method}_seed42" in command and "seed=42" in command
    assert f"  model size      {size}\n  method          {method}\n" in result.stdout


@pytest.mark.parametrize("size,nodes,gpus", [("10m", 1, 1), ("113m", 1, 8), ("1b", 4, 8)])
def test_dry_run_sizes_the_job_from_the_sbatch_defaults(size, nodes, gpus):
    result = dry_run(f"pretrain_{size}_posaug.sh")
    assert result.returncode == 0, result.stderr
    command = command_line(result.stdout)
    assert f"--nodes={nodes} --ntasks-per-node={gpus} --ntasks={nodes * gpus}" in command
    assert f"device          gpu ({gpus} GPUs/node, backend nccl)" in result.stdout


def test_dry_run_needs_no_gpu_request_to_plan_a_cpu_run():
    result = dry_run("pretrain_113m_posaug.sh", GPUS_PER_NODE="0", TASKS_PER_NODE="2")
    assert result.returncode == 0, result.stderr
    assert "device          cpu (0 GPUs/node, backend gloo)" in result.stdout
    assert "model.transformer_impl=local model.bf16=false" in command_line(result.stdout)


def test_environment_overrides_reach_the_trainer_command(tmp_path, tiny_shards):
    result = dry_run("pretrain_425m_rfs.sh", "--set", "optimizer.lr=1e-3", DATA_PREFIX=tiny_shards,
                     OUTPUT_DIR=str(tmp_path), SEED="7", TP="2", PP="2", PYTHON="/opt/py/bin/python",
                     OVERRIDES="schedule.train_iters=10 logging.log_interval=1",
                     SKIP_PREFLIGHT="1")  # the compute nodes' python is not on this host: the plan cannot run here
    assert result.returncode == 0, result.stderr
    command = command_line(result.stdout)
    assert command.split(" srun ")[1].split()[-1] == "optimizer.lr=1e-3"  # launcher arguments come last
    for expected in ("/opt/py/bin/python -m pretrain train", f"data.data_path={tiny_shards}", "seed=7",
                     f"checkpoint.save={tmp_path}/425m_rfs_seed7", "parallel.tensor_model_parallel_size=2",
                     "parallel.pipeline_model_parallel_size=2", "schedule.train_iters=10 logging.log_interval=1"):
        assert expected in command
    assert "TP / PP / DP    2 / 2 / 4" in result.stdout  # 2 nodes x 8 GPUs / (2 x 2)


def test_dp_that_does_not_match_the_allocation_is_refused():
    result = dry_run("pretrain_113m_baseline.sh", TP="2", DP="8")
    assert result.returncode == 2
    assert "DP=8 but 8 ranks / (TP=2 x PP=1) = 4" in result.stderr


@pytest.mark.parametrize("task,seed", [("0", "42"), ("1", "137"), ("2", "2024")])
def test_array_task_id_selects_the_seed(task, seed):
    # A dry run inside an array task (as `DRY_RUN=1 sbatch --array=0-2` gives); the cluster test submits one.
    result = dry_run("pretrain_42m_warp.sh", SLURM_ARRAY_TASK_ID=task)
    assert result.returncode == 0, result.stderr
    assert f"name=42m_warp_seed{seed} seed={seed}" in command_line(result.stdout)


def test_container_image_runs_the_step_in_pyxis_with_the_checkout_mounted(tiny_shards):
    # the host's python3 may lack torch (the container has it): the pre-flight cannot run there, which stops the
    # launcher unless SKIP_PREFLIGHT=1 says so (tests/slurm/test_preflight_fails_closed.py); the job checks again
    result = dry_run("pretrain_10m_baseline.sh", CONTAINER_IMAGE="nvcr.io#nvidia/pytorch:24.09-py3",
                     DATA_PREFIX=tiny_shards, PYTHON="", SKIP_PREFLIGHT="1")
    assert result.returncode == 0, result.stderr
    argv = shlex.split(command_line(result.stdout).split(":", 1)[1])  # the line is shell-quoted (printf %q)
    assert "--container-image=nvcr.io#nvidia/pytorch:24.09-py3" in argv
    assert f"--container-mounts={REPO},{REPO}/runs,{Path(tiny_shards).parent}" in argv
    assert argv[argv.index(f"{REPO}/slurm/rank_env.sh") + 1] == "python3"  # the container's, not the host venv


def test_a_dry_run_without_data_prints_the_command_then_refuses_with_exit_2():
    result = run(["bash", str(SLURM / "pretrain_10m_posaug.sh"), "--dry-run"])
    assert " srun " in command_line(result.stdout)
    assert result.returncode == 2
    assert result.stderr.strip().endswith("refused before submitting (dry run, nothing queued): error: "
                                          "data.data_path is missing: pass the data_prep --data-prefix (e.g. "
                                          "--set data.data_path=data/owt) or set data.synthetic=true")
    assert result.stderr.count("\n") == 1


def test_launcher_outside_a_job_checks_before_it_submits():
    # outside a job the launcher is the submit path: without data it stops before sbatch (the local cluster
    # tests in test_launcher_preflight.py check that nothing is queued)
    result = run(["bash", str(SLURM / "pretrain_10m_posaug.sh")])
    assert result.returncode == 2
    assert "refused before submitting (nothing queued)" in result.stderr


def test_without_python_set_the_launcher_takes_the_projects_venv_else_python3():
    venv_python = REPO / ".venv" / "bin" / "python"
    expected = str(venv_python) if os.access(venv_python, os.X_OK) else "python3"
    result = dry_run("pretrain_10m_rpe.sh", PYTHON="")
    assert f"python          {expected}\n" in result.stdout


def test_launcher_finds_the_project_from_another_directory(tmp_path):
    result = dry_run("pretrain_10m_rpe.sh", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"project root    {REPO}\n" in result.stdout


def test_data_prep_dry_run_prints_an_srun_pmix_command():
    result = run(["bash", str(SLURM / "data_prep.sh"), "--dry-run"], INPUT="/data/a /data/b.jsonl",
                 TOKENIZER="/data/tok", DATA_PREFIX="/data/shards/owt", NUM_SHARDS="16")
    assert result.returncode == 0, result.stderr
    command = command_line(result.stdout)
    assert "srun --nodes=2 --ntasks=8 --cpus-per-task=8 --mpi=pmix" in command
    assert ("-m data_prep build --tokenizer /data/tok --data-prefix /data/shards/owt --workers 8 --mpi "
            "--no-progress --input /data/a --input /data/b.jsonl --num-shards 16") in command


def test_data_prep_requires_its_inputs():
    result = run(["bash", str(SLURM / "data_prep.sh"), "--dry-run"], TOKENIZER="/t", DATA_PREFIX="/o/p")
    assert result.returncode == 2
    assert result.stderr == "set INPUT to the corpus file(s)/directory(ies)\n"


def test_data_prep_refuses_the_old_output_prefix_naming_data_prefix():
    result = run(["bash", str(SLURM / "data_prep.sh"), "--dry-run"], INPUT="/i", TOKENIZER="/t", OUTPUT_PREFIX="/o/p")
    assert result.returncode == 2
    assert result.stderr == "OUTPUT_PREFIX is now DATA_PREFIX (the training launchers' name): DATA_PREFIX=/o/p\n"
