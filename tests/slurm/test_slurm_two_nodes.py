"""The real launchers on a real two-node SLURM cluster: two network namespaces on this machine.

slurm/local/start_two_nodes.sh gives `node1` (10.77.0.11) and `node2` (10.77.0.12) their own address,
hostname and slurmd, so a job's node list, rendezvous address (the first host), one task per node and the
gloo process group all cross a real (virtual) network. Jobs are the unedited launchers with the documented
overrides only: sbatch options (-N 2 --ntasks-per-node=1 --gpus-per-node=0), TP/PP, SYNTHETIC_DATA and
OVERRIDES shrinking the 113m PosAug config to a 2-layer, 64-wide model. Every job has --time and the
tests poll `scontrol show job` under a deadline (`sbatch --wait` can return tens of seconds late).
--time=10: the 113m launcher asks for USR1 300 s before the limit, which a shorter limit would send at once.
Runtime on 2 shared cores: docs/testing.md's table (the "two-node SLURM cluster" unit).
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

pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # two-node SLURM cluster in network namespaces; minutes

REPO = Path(__file__).resolve().parents[2]
SLURM = REPO / "slurm"
TWO_NODES_DIR = os.environ.get("SLURM_TWO_NODES_DIR", "/var/lib/slurm-two-nodes")
PY = sys.executable
# Long enough for the USR1 tests' signal after step 10 and the lost node after step 25 to land mid-run, and no
# longer: every layout job and signal test trains this many steps.
ITERS = 60
TINY_113M = ("model.num_layers=2 model.hidden_size=64 model.ffn_hidden_size=128 model.num_attention_heads=4 "
             "model.num_query_groups=4 model.seq_length=32 model.vocab_size=512 schedule.global_batch_size=4 "
             "schedule.micro_batch_size=1 optimizer.lr_warmup_iters=1 logging.eval_iters=1 "
             f"schedule.train_iters={ITERS} logging.log_interval=1")
NODES_2x1 = ["--nodes=2", "--ntasks-per-node=1"]
TOLERANCE = 1e-5  # as tests/test_parallel_equivalence.py: the same math in another order
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
LAUNCHER_VARS = {"POSAUG_ROOT", "CONFIG", "DATA_PREFIX", "SYNTHETIC_DATA", "OUTPUT_DIR", "RUN_NAME", "RUN_DIR", "SEED",
                 "SEEDS", "TP", "PP", "DP", "OVERRIDES", "CONTAINER_IMAGE", "TASKS_PER_NODE", "RDZV_PORT", "RDZV_ADDR",
                 "REQUEUE", "DRY_RUN", "SRUN_EXTRA_ARGS"}


def two_node_env(**extra: str) -> dict:
    """Environment for sbatch (exported to the job): this one minus SLURM/launcher settings, plus the cluster's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_")) and k not in LAUNCHER_VARS}
    env.update(SLURM_CONF=f"{TWO_NODES_DIR}/etc/slurm.conf", PYTHON=PY, PYTHONWARNINGS="ignore")
    env.update(extra)
    return env


def two_node_sh(args: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)


def two_node_submit(script: Path, options: list[str], cwd: Path, **env: str) -> str:
    """sbatch SCRIPT with a time limit and a log in CWD; returns the job id."""
    proc = two_node_sh(["sbatch", "--parsable", "--time=10", f"--output={cwd}/job-%j.out", "--gpus-per-node=0",
                        "--cpus-per-task=1", *options, str(script)], 60, cwd=cwd, env=two_node_env(**env))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def two_node_job(job_id: str) -> dict[str, str]:
    """`scontrol show job` as a dict (JobState, Restarts, Reason, NodeList, ...)."""
    out = two_node_sh(["scontrol", "show", "job", "-o", job_id], 30, env=two_node_env()).stdout
    return dict(field.split("=", 1) for field in out.split() if "=" in field)


def two_node_log(cwd: Path, job_id: str) -> str:
    log = cwd / f"job-{job_id}.out"
    return log.read_text(errors="replace") if log.exists() else ""


def two_node_wait(job_id: str, cwd: Path, timeout: float, until=lambda job: job.get("JobState") in TERMINAL) -> dict:
    """Poll `scontrol show job` until `until(job)`; on the deadline cancel the job and fail with its log."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = two_node_job(job_id)
        if until(job):
            return job
        time.sleep(0.5)
    two_node_sh(["scancel", job_id], 30, env=two_node_env())
    pytest.fail(f"job {job_id} not done after {timeout} s ({job.get('JobState')}):\n{two_node_log(cwd, job_id)[-4000:]}")


def two_node_wait_for_line(job_id: str, cwd: Path, line: str, timeout: float) -> str:
    """Poll the job's log until it holds `line`; returns the log."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        log = two_node_log(cwd, job_id)
        if line in log:
            return log
        assert two_node_job(job_id).get("JobState") in ("PENDING", "CONFIGURING", "RUNNING"), log[-4000:]
        time.sleep(0.2)
    two_node_sh(["scancel", job_id], 30, env=two_node_env())
    pytest.fail(f"job {job_id}: no {line!r} after {timeout} s:\n{two_node_log(cwd, job_id)[-4000:]}")


def two_node_loss_curve(run_dir: Path) -> dict[int, float]:
    """{step: train/loss} from every TensorBoard file of a run (a restart's file wins)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    curve: dict[int, float] = {}
    for events in sorted((run_dir / "tensorboard").glob("events.out.tfevents.*"), key=os.path.getmtime):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        curve.update({e.step: e.value for e in accumulator.Scalars("train/loss")})
    return curve


def assert_same_curve(got: dict[int, float], expected: dict[int, float]) -> None:
    assert sorted(got) == list(range(1, ITERS + 1)) == sorted(expected)
    worst = max(abs(got[s] - expected[s]) for s in expected)
    assert worst <= TOLERANCE * max(1.0, max(map(abs, expected.values()))), f"largest loss difference {worst}"


def submit_113m(cwd: Path, options: list[str], overrides: str, **env: str) -> str:
    """Submit slurm/pretrain_113m_posaug.sh, tiny and on synthetic tokens, writing under CWD/runs."""
    return two_node_submit(SLURM / "pretrain_113m_posaug.sh", options, cwd, SYNTHETIC_DATA="1",
                           OUTPUT_DIR=str(cwd / "runs"), OVERRIDES=f"{TINY_113M} {overrides}", **env)


def finished_113m(job_id: str, cwd: Path, timeout: float = 420) -> tuple[str, Path]:
    """Wait for a submit_113m job to complete; returns (its log, its run directory)."""
    job = two_node_wait(job_id, cwd, timeout)
    log = two_node_log(cwd, job_id)
    assert job["JobState"] == "COMPLETED", log[-5000:]
    return log, cwd / "runs" / "113m_posaug_seed42"


@pytest.fixture(scope="module")
def two_nodes():
    """Start (or reuse) the two-node cluster; skip with the script's reason where namespaces are not allowed."""
    result = two_node_sh(["bash", str(SLURM / "local" / "start_two_nodes.sh")], 300, env=two_node_env())
    if result.returncode == 3:
        pytest.skip(f"two-node SLURM cluster unavailable: {result.stderr.strip()}")
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def initial_weights(two_nodes, tmp_path_factory) -> str:
    """A checkpoint every layout starts from: PP builds its stages in another order, so its own
    initialisation differs from one process's (tests/distributed/parallel_step.py loads weights for the same reason)."""
    cwd = tmp_path_factory.mktemp("initial_weights")
    _, run_dir = finished_113m(submit_113m(cwd, ["--nodes=1", "--ntasks-per-node=1"], "schedule.train_iters=2"), cwd)
    return f"checkpoint.load={run_dir}"


LAYOUTS = {"one_process": (["--nodes=1", "--ntasks-per-node=1"], {}), "dp_2x1": (NODES_2x1, {}),
           "dp_1x2": (["--nodes=1", "--ntasks-per-node=2"], {}), "tp_2x1": (NODES_2x1, {"TP": "2"}),
           "pp_2x1": (NODES_2x1, {"PP": "2"})}


@pytest.fixture(scope="module")
def layout_jobs(initial_weights, tmp_path_factory) -> dict[str, tuple[str, Path]]:
    """The same training in every layout, submitted together (SLURM runs what fits side by side)."""
    jobs = {}
    for name, (options, env) in LAYOUTS.items():
        cwd = tmp_path_factory.mktemp(name)
        jobs[name] = submit_113m(cwd, options, initial_weights, **env), cwd
    return jobs


@pytest.fixture(scope="module")
def layout_run(layout_jobs):
    """finished(name) -> (log, run dir) of one of LAYOUTS, waiting for it."""
    return lambda name: finished_113m(*layout_jobs[name])


def test_posaug_113m_on_two_nodes_runs_one_rank_per_node_meeting_at_the_first_node(layout_run):
    log, run_dir = layout_run("dp_2x1")
    port = re.search(r"\n  rendezvous      env:// node1:(\d+)\n", log)
    assert port, log[-5000:]
    assert "nodes           2 (node[1-2])" in log and "TP / PP / DP    1 / 1 / 2" in log
    assert f"\n0: rank 0/2 (node 0 node1, local rank 0) -> node1:{port.group(1)}" in log
    assert f"\n1: rank 1/2 (node 1 node2, local rank 0) -> node1:{port.group(1)}" in log
    assert "\n0: rank 0 exited with code 0" in log and "\n1: rank 1 exited with code 0" in log
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == str(ITERS)
    # Both ranks wrote their part of the final checkpoint.
    assert sorted(p.name for p in (run_dir / f"iter_{ITERS:07d}" / "rng").iterdir()) == ["rank_00000.pt", "rank_00001.pt"]


def test_two_nodes_x_one_task_trains_the_one_process_loss_curve(layout_run):
    assert_same_curve(two_node_loss_curve(layout_run("dp_2x1")[1]), two_node_loss_curve(layout_run("one_process")[1]))


def test_one_node_x_two_tasks_trains_the_two_nodes_loss_curve(layout_run):
    log, run_dir = layout_run("dp_1x2")
    assert "\n1: rank 1/2 (node 0 node" in log  # both ranks on one node
    assert_same_curve(two_node_loss_curve(run_dir), two_node_loss_curve(layout_run("dp_2x1")[1]))


@pytest.mark.parametrize("layout", ["tp_2x1", "pp_2x1"])
def test_model_parallel_across_the_two_nodes_trains_the_one_process_loss_curve(layout_run, layout):
    log, run_dir = layout_run(layout)
    expected = {"tp_2x1": "2 / 1 / 1", "pp_2x1": "1 / 2 / 1"}[layout]
    assert f"TP / PP / DP    {expected}" in log and "\n1: rank 1/2 (node 1 node2" in log
    assert_same_curve(two_node_loss_curve(run_dir), two_node_loss_curve(layout_run("one_process")[1]))


# After a periodic checkpoint (step 5): SLURM signals every process of the step, the checkpoint writer's
# multiprocessing Manager (spawned at the first save) included, and the stop save must still go through (it once
# died with BrokenPipeError). The stop save with no checkpoint before it is test_slurm_cluster.py's TERM test.
def test_usr1_on_two_nodes_saves_one_iteration_on_every_rank_requeues_and_resumes_the_same_curve(
        initial_weights, layout_run, tmp_path):
    job_id = submit_113m(tmp_path, NODES_2x1, f"{initial_weights} checkpoint.save_interval=5 checkpoint.keep_last=20")
    two_node_wait_for_line(job_id, tmp_path, "\n0: step 10/", 300)
    signal = two_node_sh(["scancel", "--signal=USR1", "--batch", job_id], 30, env=two_node_env())
    assert signal.returncode == 0, signal.stderr
    job = two_node_wait(job_id, tmp_path, 300)
    log = two_node_log(tmp_path, job_id)
    assert job["JobState"] == "COMPLETED" and job["Restarts"] == "1", log[-5000:]
    saved = re.search(r"\n0: received SIGUSR1: saved iteration (\d+), exiting with 75 for requeue", log)
    assert saved, log[-5000:]
    step = int(saved.group(1))
    assert 10 <= step < ITERS
    assert "received SIGUSR1: forwarding to the training step" in log  # the batch shell's warning, sent on
    assert (tmp_path / "runs" / "113m_posaug_seed42" / "iter_0000005").is_dir()  # the periodic save before it
    # Every rank stopped on the signal and wrote its share of that one iteration.
    assert "\n0: rank 0 exited with code 75" in log and "\n1: rank 1 exited with code 75" in log
    run_dir = tmp_path / "runs" / "113m_posaug_seed42"
    saved_dir = run_dir / f"iter_{step:07d}"
    assert {p.name for p in saved_dir.glob("__*.distcp")} == {"__0_0.distcp", "__0_1.distcp"}
    assert sorted(p.name for p in (saved_dir / "rng").iterdir()) == ["rank_00000.pt", "rank_00001.pt"]
    assert f"requeueing job {job_id}" in log and f"(job {job_id} restart 1) ====" in log
    assert f"\n0: resumed from iteration {step} (" in log
    assert_same_curve(two_node_loss_curve(run_dir), two_node_loss_curve(layout_run("dp_2x1")[1]))


def test_a_lost_node_fails_the_step_clearly_and_the_requeued_job_resumes_from_the_last_checkpoint(
        initial_weights, layout_run, tmp_path):
    for name in LAYOUTS:  # nothing else may run on node2 when it goes
        layout_run(name)
    job_id = submit_113m(tmp_path, [*NODES_2x1, "--requeue"], f"{initial_weights} checkpoint.save_interval=10")
    two_node_wait_for_line(job_id, tmp_path, "\n0: step 25/", 300)
    try:
        # node2 is lost: its slurmd, the job step and the rank on it die at once.
        pids = two_node_sh(["ip", "netns", "pids", "posaug2n-node2"], 30).stdout.split()
        assert pids
        two_node_sh(["kill", "-KILL", *pids], 30)
        # SLURM notices (SlurmdTimeout), marks node2 DOWN and puts the job back in the queue.
        job = two_node_wait(job_id, tmp_path, 120, until=lambda job: job.get("Restarts") == "1"
                            and job.get("JobState") == "PENDING")
        log = two_node_log(tmp_path, job_id)
        assert "srun: error: Node failure on node2" in log, log[-5000:]
        assert re.search(r"\n0: \[rank0\]: RuntimeError: .*Connection (reset|closed) by peer", log), log[-5000:]
        # -1 when SLURM's SIGTERM for the requeue reaches the batch shell before srun returns
        assert re.search(r"\[posaug-slurm\] training step exited with code -?[1-9]", log), log[-3000:]
        assert job["Requeue"] == "1"
        last = int((tmp_path / "runs" / "113m_posaug_seed42" / "latest_checkpointed_iteration.txt").read_text())
        # A periodic checkpoint from before the loss (step 25 was logged; on a quiet machine the run can reach
        # the save at 30 before the kill lands, so any multiple of the interval counts).
        assert last >= 20 and last % 10 == 0
        # The queued job goes on with the node that is left; the launcher reads the smaller allocation.
        # (Not node2 brought back at once: slurmctld's delayed terminate for the failed run would reach
        # it after it restarted and kill the job's rank there.)
        update = two_node_sh(["scontrol", "update", f"JobId={job_id}", "NumNodes=1", "NumTasks=1"], 30,
                             env=two_node_env())
        assert update.returncode == 0, update.stderr
        job = two_node_wait(job_id, tmp_path, 300)
        log = two_node_log(tmp_path, job_id)
        assert job["JobState"] == "COMPLETED", log[-5000:]
        assert f"(job {job_id} restart 1) ====" in log and "TP / PP / DP    1 / 1 / 1" in log
        assert f"\n0: resumed from iteration {last} (" in log
        assert_same_curve(two_node_loss_curve(tmp_path / "runs" / "113m_posaug_seed42"),
                          two_node_loss_curve(layout_run("dp_2x1")[1]))
    finally:
        # The node comes back: only its slurmd is started.
        back = two_node_sh(["bash", str(SLURM / "local" / "start_two_nodes.sh")], 120, env=two_node_env())
    assert back.returncode == 0 and "starting slurmd node2" in back.stdout, back.stdout + back.stderr
    assert "slurmd node1 already running" in back.stdout


def test_data_prep_with_one_mpi_rank_per_node_writes_the_one_rank_shards(two_nodes, tmp_path):
    def data_prep(*args: str) -> None:
        r = two_node_sh([PY, "-m", "data_prep", *args], 300, cwd=REPO, env=two_node_env())
        assert r.returncode == 0, r.stderr[-3000:]

    data_prep("embedded-corpus", "--output", str(tmp_path / "corpus"), "--max-bytes", "100000")
    data_prep("train-tokenizer", "--input", str(tmp_path / "corpus"), "--output", str(tmp_path / "tok"),
              "--kind", "sentencepiece-bpe", "--vocab-size", "512")
    shared = ["--num-shards", "3", "--chunk-bytes", "20000"]
    data_prep("build", "--input", str(tmp_path / "corpus"), "--tokenizer", str(tmp_path / "tok"), *shared,
              "--data-prefix", str(tmp_path / "one" / "c"), "--workers", "1", "--no-progress")
    job_id = two_node_submit(SLURM / "data_prep.sh", NODES_2x1, tmp_path, INPUT=str(tmp_path / "corpus"),
                             TOKENIZER=str(tmp_path / "tok"), DATA_PREFIX=str(tmp_path / "two" / "c"),
                             NUM_SHARDS="3", WORKERS="1", DATA_PREP_ARGS="--chunk-bytes 20000")
    job = two_node_wait(job_id, tmp_path, 180)
    log = two_node_log(tmp_path, job_id)
    assert job["JobState"] == "COMPLETED", log[-5000:]
    assert "MPI ranks       2 on 2 node(s) (node[1-2])" in log
    assert json.loads((tmp_path / "two" / "c_manifest.json").read_text())["settings"]["ranks"] == 2

    def shards(out: Path) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.suffix in (".bin", ".idx")}

    assert len(shards(tmp_path / "two")) == 8  # 3 train shards + valid, .bin and .idx
    assert shards(tmp_path / "two") == shards(tmp_path / "one")
