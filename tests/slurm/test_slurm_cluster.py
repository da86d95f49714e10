"""The real slurm/ scripts submitted to a real single-node SLURM cluster on localhost.

The module fixture runs slurm/local/start.sh (Debian's munge, slurmctld and slurmd; installed when
missing, idempotent) and leaves the cluster running. Jobs are CPU smoke runs of the real launchers: the
GPU defaults in their #SBATCH lines are overridden on the sbatch command line
(--gpus-per-node=0 --ntasks-per-node=2 --cpus-per-task=1), exactly as a user would on a CPU partition,
and the model is shrunk with OVERRIDES (the 113m config's optimiser, positions and schedule code paths,
with a 2-layer, 64-wide model so that two ranks train on two shared cores in seconds). Jobs are submitted
from a temporary directory, so the launchers must find the project from the path sbatch was given.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # real SLURM daemons; minutes

REPO = Path(__file__).resolve().parents[2]
SLURM = REPO / "slurm"
LOCAL_DIR = os.environ.get("SLURM_LOCAL_DIR", "/var/lib/slurm-local")
PY = sys.executable

# A tiny model on the 113m posaug config (common.sh itself switches CPU runs to the local
# implementation, FP32 and the plain optimizer).
TINY = ("model.num_layers=2 model.hidden_size=64 model.ffn_hidden_size=128 model.num_attention_heads=4 "
        "model.num_query_groups=4 model.seq_length=32 model.vocab_size=512 schedule.global_batch_size=4 "
        "schedule.micro_batch_size=1 optimizer.lr_warmup_iters=1 "
        "logging.eval_iters=1")
CPU_JOB = ["--gpus-per-node=0", "--ntasks-per-node=2", "--cpus-per-task=1", "--time=10"]


def job_env(**extra: str) -> dict:
    """This environment for sbatch (it exports it to the job), minus any outer job's SLURM_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env.update(SLURM_CONF=f"{LOCAL_DIR}/etc/slurm.conf", PYTHON=PY, PYTHONWARNINGS="ignore")
    env.update(extra)
    return env


def sh(args: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)


def sbatch_wait(script: Path, options: list[str], cwd: Path, timeout: float, **env: str) -> tuple[int, str]:
    """`sbatch --wait` (returns the job's exit code) under a timeout; returns (code, the job's log)."""
    proc = sh(["timeout", str(timeout), "sbatch", "--wait", "--parsable", f"--output={cwd}/job-%j.out",
               *options, str(script)], timeout + 10, cwd=cwd, env=job_env(**env))
    job_id = proc.stdout.strip().split(";")[0]
    log = Path(cwd, f"job-{job_id}.out")
    text = log.read_text() if job_id and log.exists() else ""
    assert proc.returncode != 124, f"job {job_id} still running after {timeout} s:\n{text[-4000:]}"
    return proc.returncode, text


def pid_of(name: str) -> int:
    return int(Path(LOCAL_DIR, "run", f"{name}.pid").read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.fixture(scope="module")
def cluster():
    """Start (or reuse) the local cluster via the real script."""
    result = sh(["bash", str(SLURM / "local" / "start.sh")], 600, env=job_env())
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Embedded corpus, a 512-piece SentencePiece model, and a single-process reference build."""
    root = tmp_path_factory.mktemp("slurm_data")

    def data_prep(*args: str) -> None:
        r = sh([PY, "-m", "data_prep", *args], 300, cwd=REPO, env=job_env())
        assert r.returncode == 0, r.stderr[-3000:]

    data_prep("embedded-corpus", "--output", str(root / "corpus"), "--max-bytes", "200000")
    data_prep("train-tokenizer", "--input", str(root / "corpus"), "--output", str(root / "tok"),
              "--kind", "sentencepiece-bpe", "--vocab-size", "512")
    data_prep("build", *BUILD_ARGS(root), "--data-prefix", str(root / "local" / "c"), "--workers", "1")
    return root


def BUILD_ARGS(root: Path) -> list[str]:  # noqa: N802 - the shared build arguments, local and SLURM
    return ["--input", str(root / "corpus"), "--tokenizer", str(root / "tok"), "--num-shards", "3",
            "--chunk-bytes", "20000", "--no-progress"]


def shard_bytes(out_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out_dir.iterdir()) if p.suffix in (".bin", ".idx")}


def test_sbatch_113m_posaug_trains_on_two_cpu_ranks_to_a_checkpoint_with_tensorboard(cluster, data, tmp_path):
    code, log = sbatch_wait(SLURM / "pretrain_113m_posaug.sh", CPU_JOB, tmp_path, 300,
                            DATA_PREFIX=str(data / "local" / "c"), OUTPUT_DIR=str(tmp_path / "runs"),
                            OVERRIDES=f"{TINY} schedule.train_iters=3 logging.log_interval=1")
    assert code == 0, log[-5000:]
    run_dir = tmp_path / "runs" / "113m_posaug_seed42"
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    assert (run_dir / "iter_0000003").is_dir()
    events = list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert events and all(e.stat().st_size > 0 for e in events)
    # Both ranks ran the trainer (srun --label prefixes every line with its rank) and exited cleanly.
    for rank in (0, 1):
        assert f"\n{rank}: rank {rank}/2 (node 0" in log
        assert f"\n{rank}: rank {rank} exited with code 0" in log
    assert "\n0: step 3/3 | loss" in log
    assert "device          cpu (0 GPUs/node, backend gloo)" in log
    config = (run_dir / "config.yaml").read_text()
    assert "name: 113m_posaug_seed42" in config and "strategy: posaug" in config
    assert f"data_path: {data / 'local' / 'c'}" in config


# Steps of the stop-signal jobs: the signal is sent at step 5 and lands within a few steps (~0.06 s each alone),
# so the run is still training when it arrives, and the rerun trains the rest.
STOP_STEPS = 60


# TERM to the job step is what slurmstepd delivers to every process of the step on preemption or `scancel
# --signal=TERM`; here with no checkpoint before it, so the stop save is the first. USR1 to the batch shell (the
# launcher's time-limit warning, #SBATCH --signal=B:USR1@...) is test_slurm_two_nodes.py's USR1 test.
def test_term_to_the_job_step_checkpoints_requeues_and_resumes_from_that_step(cluster, tmp_path):
    env = job_env(SYNTHETIC_DATA="1", OUTPUT_DIR=str(tmp_path / "runs"),
                  OVERRIDES=f"{TINY} schedule.train_iters={STOP_STEPS} logging.log_interval=5 checkpoint.save_interval=1000")
    waiter = subprocess.Popen(["timeout", "400", "sbatch", "--wait", "--parsable", f"--output={tmp_path}/job-%j.out",
                               *CPU_JOB, str(SLURM / "pretrain_113m_posaug.sh")],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        log_file = None
        deadline = time.time() + 240
        while time.time() < deadline:  # wait until training is under way, then preempt it
            logs = list(tmp_path.glob("job-*.out"))
            if logs and f"\n0: step 5/{STOP_STEPS} |" in logs[0].read_text():
                log_file = logs[0]
                break
            assert waiter.poll() is None, waiter.communicate()
            time.sleep(0.1)
        assert log_file is not None, "training did not start within 240 s"
        job_id = re.match(r"job-(\d+)\.out", log_file.name).group(1)
        signal = sh(["scancel", "--signal=TERM", job_id], 30, env=env)
        assert signal.returncode == 0, signal.stderr
        out, err = waiter.communicate(timeout=420)
    finally:
        if waiter.poll() is None:
            waiter.kill()
    log = log_file.read_text()
    assert waiter.returncode == 0, log[-5000:] + err
    saved = re.search(r"\n0: received SIGTERM: saved iteration (\d+), exiting with 75 for requeue", log)
    assert saved, log[-5000:]
    step = int(saved.group(1))
    assert 5 <= step < STOP_STEPS
    assert "forwarding to the training step" not in log  # slurmstepd signalled the step itself
    assert "the trainer saved a checkpoint on a stop signal (exit code 75)" in log
    assert f"requeueing job {job_id}" in log
    assert f"(job {job_id} restart 1) ====" in log  # the same job id, started again by SLURM
    assert f"\n0: resumed from iteration {step} (" in log
    assert f"\n0: step {STOP_STEPS}/{STOP_STEPS} |" in log
    run_dir = tmp_path / "runs" / "113m_posaug_seed42"
    assert (run_dir / f"iter_{step:07d}").is_dir()
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == str(STOP_STEPS)


def test_data_prep_batch_script_with_two_mpi_ranks_writes_the_local_runs_shards(cluster, data, tmp_path):
    args = BUILD_ARGS(data)
    extra = " ".join(args[args.index("--chunk-bytes"):])  # everything but input, tokenizer, shards
    code, log = sbatch_wait(SLURM / "data_prep.sh", ["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1"],
                            tmp_path, 300, INPUT=str(data / "corpus"), TOKENIZER=str(data / "tok"),
                            DATA_PREFIX=str(tmp_path / "slurm" / "c"), NUM_SHARDS="3", WORKERS="1",
                            DATA_PREP_ARGS=extra)
    assert code == 0, log[-5000:]
    assert "x 2 rank(s)" in log
    manifest = json.loads((tmp_path / "slurm" / "c_manifest.json").read_text())
    assert manifest["settings"]["ranks"] == 2
    slurm_shards, local_shards = shard_bytes(tmp_path / "slurm"), shard_bytes(data / "local")
    assert len(slurm_shards) == 8  # 3 train shards + valid, .bin and .idx
    assert slurm_shards == local_shards


def test_a_data_prep_rank_that_segfaults_names_its_python_frame_in_the_job_log(cluster, tmp_path):
    # PYTHON stands in for the interpreter: it starts MPI like data_prep, and rank 1 then crashes in native code.
    crashing_python = tmp_path / "python"
    crashing_python.write_text(f"""#!/bin/sh
exec {PY} -c 'from mpi4py import MPI
import ctypes
def tokenise_in_native_code():
    ctypes.string_at(0)
if MPI.COMM_WORLD.Get_rank() == 1:
    tokenise_in_native_code()
MPI.COMM_WORLD.Barrier()'
""")
    crashing_python.chmod(0o755)
    code, log = sbatch_wait(SLURM / "data_prep.sh", ["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1"],
                            tmp_path, 120, INPUT=str(tmp_path), TOKENIZER=str(tmp_path),
                            DATA_PREFIX=str(tmp_path / "out" / "c"), PYTHON=str(crashing_python))
    assert code != 0, log[-3000:]
    assert "Fatal Python error: Segmentation fault" in log, log[-3000:]
    assert "tokenise_in_native_code" in log, log[-3000:]


def test_job_array_runs_one_task_per_seed(cluster, tmp_path):
    code, _ = sbatch_wait(SLURM / "pretrain_10m_rfs.sh",
                          ["--array=0-2", "--gpus-per-node=0", "--ntasks-per-node=1", "--cpus-per-task=1",
                           "--time=10", f"--output={tmp_path}/array-%A_%a.out"], tmp_path, 240, DRY_RUN="1",
                          SYNTHETIC_DATA="1")  # without data the dry run ends with the pre-flight refusal
    # --time=10: above the launcher's 300 s USR1 lead, which would stop the dry run's pre-flight check
    assert code == 0
    seeds = {}
    for log in tmp_path.glob("array-*_*.out"):
        task = log.stem.rsplit("_", 1)[1]
        seeds[task] = re.search(r"\n  seed +(\d+)\n", log.read_text()).group(1)
    assert seeds == {"0": "42", "1": "137", "2": "2024"}


def test_start_script_is_idempotent(cluster):
    before = pid_of("slurmctld"), pid_of("slurmd")
    again = sh(["bash", str(SLURM / "local" / "start.sh")], 120, env=job_env())
    assert again.returncode == 0, again.stderr
    assert "slurmctld already running" in again.stdout and "slurmd already running" in again.stdout
    assert (pid_of("slurmctld"), pid_of("slurmd")) == before


def test_stop_script_stops_the_daemons_by_pid_file_and_start_brings_them_back(cluster):
    pids = {name: pid_of(name) for name in ("slurmctld", "slurmd")}
    munged = int(Path("/run/munge/munged.pid").read_text())
    stop = sh(["bash", str(SLURM / "local" / "stop.sh")], 120, env=job_env())
    assert stop.returncode == 0, stop.stderr
    assert not any(alive(pid) for pid in [*pids.values(), munged])
    assert not Path(LOCAL_DIR, "run", "slurmctld.pid").exists()
    assert "no PID file" in sh(["bash", str(SLURM / "local" / "stop.sh")], 60, env=job_env()).stdout  # idempotent
    start = sh(["bash", str(SLURM / "local" / "start.sh")], 300, env=job_env())
    assert start.returncode == 0, start.stdout + start.stderr
    hostname = sh(["srun", "--ntasks=2", "--mpi=none", "hostname"], 60, env=job_env())
    assert hostname.returncode == 0 and len(hostname.stdout.split()) == 2, hostname.stderr
