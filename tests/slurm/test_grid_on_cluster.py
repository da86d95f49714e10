"""`reproduce --slurm --preset cpu-tiny` through the real local SLURM cluster: data, training arrays, evaluation
and report jobs chained by real dependencies; one training job killed with scancel mid-way; the rerun
resubmits only that run (and its evaluation and the report), which resumes from its checkpoint.

One grid (baseline and PosAug, seed 42, STEPS tiny steps so that a run can be killed while it trains) goes
through every stage in the module fixture; each test reads one part of what happened.
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

from conftest import REPO

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.e2e]  # real SLURM daemons; minutes

LOCAL_DIR = os.environ.get("SLURM_LOCAL_DIR", "/var/lib/slurm-local")
PY = sys.executable
# PosAug is killed at step KILL_AT, past its first periodic save; the rerun trains the rest from that save
STEPS, KILL_AT, SAVE_INTERVAL = 120, 60, 50
GRID = ["--preset", "cpu-tiny", "--methods", "posaug", "--set", f"schedule.train_iters={STEPS}",
        "logging.log_interval=5", f"checkpoint.save_interval={SAVE_INTERVAL}"]


def job_env() -> dict:
    """This environment for sbatch (it exports it to the jobs), minus any outer job's SLURM_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env.update(SLURM_CONF=f"{LOCAL_DIR}/etc/slurm.conf", PYTHON=PY, PYTHONWARNINGS="ignore",
               PYTHONPATH=str(REPO))
    return env


def grid(out: Path, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([PY, "-m", "pretrain", "reproduce", "--slurm", *GRID, "--output", str(out), *extra],
                          cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def live_jobs(prefix: str = "") -> set[str]:
    """Ids of the queued/running jobs (array tasks one by one) whose name starts with `prefix`."""
    proc = subprocess.run(["squeue", "-h", "-r", "-o", "%i %j"], env=job_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = (line.split(maxsplit=1) for line in proc.stdout.splitlines())
    return {job for job, name in rows if name.startswith(prefix)}


def grid_jobs(out: Path) -> set[str]:
    jobs = json.loads((out / "grid.json").read_text())["jobs"]
    return {j for j in [jobs["data"], jobs["report"], *jobs["train"].values(), *jobs["eval"].values()] if j}


def wait_drained(out: Path, timeout: float) -> None:
    """Until no job of the grid is queued or running."""
    deadline = time.time() + timeout
    while grid_jobs(out) & live_jobs():
        logs = "\n".join(f"== {p.name}\n{p.read_text()[-1500:]}" for p in sorted((out / "logs").glob("*.out")))
        assert time.time() < deadline, f"grid jobs {grid_jobs(out) & live_jobs()} still live after {timeout} s\n{logs}"
        time.sleep(3)


def submitted(proc: subprocess.CompletedProcess) -> list[str]:
    return re.findall(r"^\[grid\] submitted (\w+)=", proc.stdout, re.M)


@pytest.fixture(scope="module")
def cluster():
    result = subprocess.run(["bash", str(REPO / "slurm" / "local" / "start.sh")], env=job_env(), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def story(cluster, tmp_path_factory):
    """Submit; kill PosAug's training job mid-way; let the rest finish; rerun; let it finish; rerun once more."""
    out = tmp_path_factory.mktemp("grid") / "tiny"
    seen = {"first": grid(out)}
    task = json.loads((out / "grid.json").read_text())["jobs"]["train"]["tiny_posaug_seed42"]
    log = out / "logs" / f"train-tiny_posaug-{task}.out"
    deadline = time.time() + 420
    while not (log.is_file() and f"0: step {KILL_AT}/{STEPS} |" in log.read_text()):
        text = log.read_text()[-3000:] if log.is_file() else ""
        assert time.time() < deadline, f"PosAug did not reach step {KILL_AT} in time:\n{text}"
        assert task in live_jobs(), f"{task} ended before it could be killed:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
    cancel = subprocess.run(["scancel", task], env=job_env(), capture_output=True, text=True, timeout=60)
    assert cancel.returncode == 0, cancel.stderr
    seen["killed"] = task
    wait_drained(out, 600)
    seen["status_after_kill"] = grid(out, "--status").stdout
    seen["report_after_kill"] = (out / "report.md").read_text()
    seen["second"] = grid(out)
    wait_drained(out, 600)
    seen["status"] = grid(out, "--status").stdout
    seen["report"] = (out / "report.md").read_text()
    seen["third"] = grid(out)
    seen["out"] = out
    return seen


def test_the_grid_is_one_data_job_a_training_array_and_an_evaluation_per_run_and_a_report(story):
    assert submitted(story["first"]) == ["DATA", "TRAIN_TINY_BASELINE", "EVAL_TINY_BASELINE_SEED42",
                                         "TRAIN_TINY_POSAUG", "EVAL_TINY_POSAUG_SEED42", "REPORT"]
    first = story["first"].stdout
    assert re.search(r"TRAIN_TINY_POSAUG=(\d+) .*--array=0 .*--dependency=afterok:(\d+) ", first)
    posaug = re.search(r"TRAIN_TINY_POSAUG=(\d+) ", first).group(1)
    assert re.search(rf"EVAL_TINY_POSAUG_SEED42=\d+ .*--dependency=afterok:{posaug}_0 ", first)
    assert re.search(r"tiny_posaug +1 +[\d.]+ GiB +yes", first)  # the plan came first


def test_the_killed_run_is_failed_and_missing_from_the_report_while_the_other_finishes(story):
    status = story["status_after_kill"]
    assert re.search(rf"^tiny_baseline_seed42 +finished +\S+ +{STEPS}/{STEPS} +[\d.]+ +yes$", status, re.M), status
    assert re.search(rf"^tiny_posaug_seed42 +(failed|stopped) +{story['killed']} +\d+/{STEPS} +[\d.]+ +no$", status,
                     re.M)
    assert "**Missing** (not trained or not evaluated yet; rerun the same command to resubmit): posaug seed 42." \
        in story["report_after_kill"]
    killed_log = (story["out"] / "logs" / f"train-tiny_posaug-{story['killed']}.out").read_text()
    assert "was cancelled (scancel): not requeueing" in killed_log, killed_log[-3000:]  # the person's scancel stands
    assert re.search(r"^\| baseline \| 1 \|", story["report_after_kill"], re.M)


def test_the_rerun_resubmits_only_the_killed_run_its_evaluation_and_the_report(story):
    assert submitted(story["second"]) == ["TRAIN_TINY_POSAUG", "EVAL_TINY_POSAUG_SEED42", "REPORT"]
    assert "--array=0 " in story["second"].stdout


def test_the_resubmitted_run_resumes_from_its_checkpoint(story):
    task = json.loads((story["out"] / "grid.json").read_text())["jobs"]["train"]["tiny_posaug_seed42"]
    assert task != story["killed"]
    log = (story["out"] / "logs" / f"train-tiny_posaug-{task}.out").read_text()
    # scancel's SIGTERM reaches the trainer, which saves where it stopped; else the newest periodic save counts
    killed_log = (story["out"] / "logs" / f"train-tiny_posaug-{story['killed']}.out").read_text()
    stop_save = re.search(r"\n0: received SIGTERM: saved iteration (\d+),", killed_log)
    expected = stop_save.group(1) if stop_save else f"({'|'.join(map(str, range(SAVE_INTERVAL, STEPS, SAVE_INTERVAL)))})"
    assert re.search(rf"\n0: resumed from iteration {expected} ", log), log[-3000:]
    assert f"\n0: step {STEPS}/{STEPS} |" in log


def test_the_grid_ends_with_every_run_finished_evaluated_and_in_the_report(story):
    assert re.search(r"^2 finished \(2 runs\)$", story["status"], re.M), story["status"]
    assert "not written yet" not in story["status"]
    report = story["report"]
    assert "No run missing." in report
    for label in ("baseline", "posaug", "baseline+pi", "baseline+ntk", "baseline+yarn"):
        assert re.search(rf"^\| {re.escape(label)} \| 1 \|", report, re.M)
    results = story["out"] / "results" / "tiny"
    assert json.loads((results / "results.json").read_text())["summary"]["posaug"]["n"] == 1
    assert "](results/tiny/per_position_loss.png)" in report and (results / "per_position_loss.png").stat().st_size


def test_a_finished_grid_submits_nothing(story):
    assert submitted(story["third"]) == []
    assert "nothing to submit: every run is finished and evaluated" in story["third"].stdout


def test_a_grid_with_a_run_that_cannot_fit_submits_nothing_to_the_cluster(cluster, tmp_path):
    before = live_jobs("grid-")
    (tmp_path / "corpus").mkdir()  # the grid checks that both exist before planning
    (tmp_path / "tokenizer.json").write_text("{}")
    proc = subprocess.run([PY, "-m", "pretrain", "reproduce", "--slurm", "--sizes", "10m", "113m", "--methods",
                           "posaug", "--seeds", "42", "--set", "schedule.micro_batch_size=32", "--output",
                           str(tmp_path / "grid"), "--data-prefix", str(tmp_path / "owt"), "--input",
                           str(tmp_path / "corpus"), "--tokenizer", str(tmp_path / "tokenizer.json")],
                          cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: the grid does not fit, nothing was submitted: 113m_baseline: "
                                  "schedule.global_batch_size (128) must be divisible by micro-batch x DP (32 x 8)")
    assert re.search(r"^10m_posaug +1 .* yes ", proc.stdout, re.M)  # the rest of the grid would fit
    assert not (tmp_path / "grid").exists()
    assert live_jobs("grid-") <= before


def test_on_the_two_node_cluster_the_grid_trains_each_run_across_both_nodes_to_its_report(tmp_path):
    two_nodes = os.environ.get("SLURM_TWO_NODES_DIR", "/var/lib/slurm-two-nodes")
    env = {**job_env(), "SLURM_CONF": f"{two_nodes}/etc/slurm.conf"}
    start = subprocess.run(["bash", str(REPO / "slurm" / "local" / "start_two_nodes.sh")], env=env,
                           capture_output=True, text=True, timeout=600)
    if start.returncode == 3:
        pytest.skip(f"two-node cluster unavailable here: {start.stderr.strip() or start.stdout.strip()}")
    assert start.returncode == 0, start.stdout + start.stderr
    out = tmp_path / "two"
    command = [PY, "-m", "pretrain", "reproduce", "--slurm", "--preset", "cpu-tiny", "--methods", "posaug",
               "--nodes", "2", "--set", "schedule.micro_batch_size=8", "--output", str(out)]  # DP 2 x 8 = 16
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = json.loads((out / "grid.json").read_text())["jobs"]
    ours = {j for j in [jobs["data"], jobs["report"], *jobs["train"].values(), *jobs["eval"].values()] if j}
    deadline = time.time() + 600
    while True:
        queue = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], env=env, capture_output=True, text=True, timeout=60)
        if not ours & set(queue.stdout.split()):
            break
        assert time.time() < deadline, f"grid jobs still live after 600 s: {ours & set(queue.stdout.split())}"
        time.sleep(3)
    for method in ("baseline", "posaug"):
        log = (out / "logs" / f"train-tiny_{method}-{jobs['train'][f'tiny_{method}_seed42']}.out").read_text()
        assert "nodes           2 (node[1-2])" in log and "\n1: rank 1/2 (node 1 node2, local rank 0)" in log
        assert "\n1: rank 1 exited with code 0" in log
    report = (out / "report.md").read_text()
    assert "No run missing." in report and re.search(r"^\| posaug \| 1 \|", report, re.M)
    status = subprocess.run([*command, "--status"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert re.search(r"^2 finished \(2 runs\)$", status.stdout, re.M), status.stdout + status.stderr
