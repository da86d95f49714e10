"""A network partition between the two nodes of the real two-node SLURM cluster (slurm/local/start_two_nodes.sh):
the hang watchdog ends the job within the train timeout, names the rank and node cut off, the launcher requeues
the job, and the requeued job resumes from the newest checkpoint. On the single-node cluster (slurm/local/start.sh),
a SIGSTOPped rank past MAX_HANG_REQUEUES is not requeued: the job fails with the hang's exit code; a SIGSTOPped
rank 0, which hosts the rendezvous store under srun, is named with its host by rank 1 within the timeout.

The partition is a blackhole route in each node's namespace for the other node's address: the link between
the two nodes is gone while each still reaches slurmctld, as when a switch port between two racks fails.
Skipped with the start script's reason where this machine lacks network-namespace rights. ~3 min on 2 cores.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from test_slurm_cluster import CPU_JOB, SLURM, TINY, cluster, job_env, sh  # noqa: F401
from test_slurm_two_nodes import (NODES_2x1, submit_113m, two_node_log, two_node_sh, two_node_wait,  # noqa: F401
                                  two_node_wait_for_line, two_nodes)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TIMEOUT_S = 20
MARGIN_S = 30  # the report, then slurm/common_run.sh HANG_SRUN_GRACE (10 s) and 5 s for the cancelled step
ADDRESSES = {"node1": "10.77.0.11", "node2": "10.77.0.12"}


def partition(cut: bool) -> None:
    """Add (or remove) a blackhole route to the other node in each node's network namespace."""
    for node, other in (("node1", "node2"), ("node2", "node1")):
        action = "add" if cut else "del"
        proc = two_node_sh(["ip", "netns", "exec", f"posaug2n-{node}", "ip", "route", action, "blackhole",
                            f"{ADDRESSES[other]}/32"], 30)
        assert proc.returncode == 0 or not cut, proc.stderr


def test_a_partition_between_the_nodes_ends_the_job_in_the_timeout_names_the_node_and_the_requeue_resumes(
        two_nodes, tmp_path):
    job_id = submit_113m(tmp_path, [*NODES_2x1, "--requeue"],
                         f"schedule.train_iters=30 checkpoint.save_interval=10 logging.eval_interval=1000 "
                         f"parallel.train_timeout_seconds={TIMEOUT_S} parallel.distributed_timeout_minutes=1")
    two_node_wait_for_line(job_id, tmp_path, "\n0: step 14/", 300)
    try:
        partition(True)
        cut = time.time()
        two_node_wait_for_line(job_id, tmp_path, "training step exited with code", 60 + MARGIN_S + 60)
        ended = time.time() - cut
    finally:
        partition(False)
    log = two_node_wait_for_line(job_id, tmp_path, "[posaug-slurm] hang 1 of at most", 30)
    report = re.search(r"\[posaug-slurm\] the trainer reported a hang: (hang: .*)", log)
    assert report, log[-4000:]
    # steps take ~0.05 s here, so the cut may land in the checkpoint save of step 20, which has the start-up timeout
    timeout_s = TIMEOUT_S if "(parallel.train_timeout_seconds)" in report.group(1) else 60
    print(f"the cut to the end of the job step: {ended:.1f} s ({timeout_s} s timeout)")  # -s; slurm/README.md
    assert ended <= timeout_s + MARGIN_S, log[-4000:]
    assert "rank 1 on node2 (last completed step " in report.group(1) and "stopped reporting" in report.group(1)
    assert "hung node(s): node2 (to keep them out: sbatch --exclude=node2" in log
    assert f"hang 1 of at most 3 in a row at checkpoint" in log and f"requeueing job {job_id}" in log
    last = int(re.search(r"in a row at checkpoint (\d+)", log).group(1))
    assert last >= 10 and last % 10 == 0

    job = two_node_wait(job_id, tmp_path, 420)
    log = two_node_log(tmp_path, job_id)
    assert job["JobState"] == "COMPLETED" and job["Restarts"] == "1", log[-5000:]
    assert f"(job {job_id} restart 1) ====" in log and f"\n0: resumed from iteration {last} (" in log
    run_dir = tmp_path / "runs" / "113m_posaug_seed42"
    # the hang's evidence is kept by the restart: the report and the stacks of the rank that could still run
    kept = run_dir / "hang.1"
    assert (kept / "report.txt").read_text().startswith(report.group(1))
    assert (kept / "rank_0.txt").read_text().startswith("rank 0 of 2 on node1")
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text() == "30"


def submit_unrequeued_training_job(tmp_path: Path) -> tuple[str, Path]:
    """A 400-step tiny job with the short train timeout and no hang requeue: (job id, its log file)."""
    env = job_env(SYNTHETIC_DATA="1", OUTPUT_DIR=str(tmp_path / "runs"), MAX_HANG_REQUEUES="0",
                  # no save or validation after the start: a stop (polled from the log) must land in a training
                  # step, not in a save, which has the start-up timeout
                  OVERRIDES=f"{TINY} schedule.train_iters=400 logging.log_interval=1 checkpoint.save_interval=1000 "
                            f"logging.eval_interval=1000 parallel.train_timeout_seconds={TIMEOUT_S} "
                            f"parallel.distributed_timeout_minutes=1")
    submit = sh(["sbatch", "--parsable", f"--output={tmp_path}/job-%j.out", "--requeue", *CPU_JOB,
                 str(SLURM / "pretrain_113m_posaug.sh")], 60, cwd=tmp_path, env=env)
    assert submit.returncode == 0, submit.stderr
    job_id = submit.stdout.strip().split(";")[0]
    return job_id, tmp_path / f"job-{job_id}.out"


def test_a_hang_past_max_hang_requeues_is_not_requeued_and_the_job_exits_with_the_hang_code(cluster, tmp_path):
    from pretrain.trainer.watchdog import HANG_EXIT_CODE

    run_dir = tmp_path / "runs" / "113m_posaug_seed42"
    job_id, log_file = submit_unrequeued_training_job(tmp_path)
    try:
        deadline = time.time() + 240
        while "\n0: step 4/400 |" not in (log_file.read_text() if log_file.exists() else ""):
            assert time.time() < deadline, log_file.read_text()[-3000:] if log_file.exists() else "no log"
            time.sleep(0.5)
        victim = next(int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _is_rank_1_of(pid, run_dir))
        os.kill(victim, signal.SIGSTOP)
        while sh(["squeue", "-h", "-j", job_id], 30, env=job_env()).stdout.strip():
            assert time.time() < deadline + TIMEOUT_S + MARGIN_S, log_file.read_text()[-3000:]
            time.sleep(0.5)
    finally:
        sh(["scancel", job_id], 30, env=job_env())
    log = log_file.read_text()
    assert f"[posaug-slurm] hung node(s): {os.uname().nodename}" in log, log[-3000:]
    assert "not requeueing: 1 hangs in a row with no checkpoint after" in log and "MAX_HANG_REQUEUES=0" in log
    job = sh(["scontrol", "show", "job", job_id], 30, env=job_env()).stdout
    assert f"ExitCode={HANG_EXIT_CODE}:0" in job and "Restarts=0" in job, job
    assert (run_dir / "hang" / "report.txt").read_text().startswith("hang: no progress for")


def test_the_store_host_rank_0_stopped_ends_the_job_in_the_timeout_naming_rank_0_and_its_host(cluster, tmp_path):
    from pretrain.trainer.watchdog import HANG_EXIT_CODE

    run_dir = tmp_path / "runs" / "113m_posaug_seed42"
    job_id, log_file = submit_unrequeued_training_job(tmp_path)
    victim = None
    try:
        deadline = time.time() + 240
        while "\n0: step 4/400 |" not in (log_file.read_text() if log_file.exists() else ""):
            assert time.time() < deadline, log_file.read_text()[-3000:] if log_file.exists() else "no log"
            time.sleep(0.5)
        # under srun rank 0 hosts the rendezvous store (slurm/common.sh: env:// at MASTER_ADDR)
        victim = next(int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _is_rank_of(pid, run_dir, 0))
        os.kill(victim, signal.SIGSTOP)
        stopped = time.time()
        while sh(["squeue", "-h", "-j", job_id], 30, env=job_env()).stdout.strip():
            assert time.time() < stopped + 60 + MARGIN_S + 60, log_file.read_text()[-3000:]
            time.sleep(0.5)
        ended = time.time() - stopped
    finally:
        sh(["scancel", job_id], 30, env=job_env())
        if victim is not None:
            try:
                os.kill(victim, signal.SIGCONT)
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
    log = log_file.read_text()
    report = re.search(r"\[posaug-slurm\] the trainer reported a hang: (hang: .*)", log)
    assert report, log[-4000:]
    print(f"rank 0 stopped to the end of the job: {ended:.1f} s ({TIMEOUT_S} s timeout)")  # -s
    assert ended <= TIMEOUT_S + MARGIN_S, log[-4000:]
    assert "rank 1 on" in report.group(1) and "cannot reach the other ranks" in report.group(1)
    assert f"is hosted by rank 0 on {os.uname().nodename}: rank 0 stopped" in report.group(1)
    assert f"[posaug-slurm] hung node(s): {os.uname().nodename}" in log, log[-3000:]
    job = sh(["scontrol", "show", "job", job_id], 30, env=job_env()).stdout
    assert f"ExitCode={HANG_EXIT_CODE}:0" in job, job
    assert [pid for pid in os.listdir("/proc") if pid.isdigit() and _is_rank_of(pid, run_dir, 0)] == []
    assert [pid for pid in os.listdir("/proc") if pid.isdigit() and _is_rank_of(pid, run_dir, 1)] == []


def _is_rank_1_of(pid: str, run_dir: Path) -> bool:
    return _is_rank_of(pid, run_dir, 1)


def _is_rank_of(pid: str, run_dir: Path, rank: int) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return (f"RANK={rank}".encode() in environ and cmdline.split(b"\0")[0].endswith(b"python")  # not rank_env.sh
            and f"checkpoint.save={run_dir}".encode() in cmdline)
