"""A rank stopped before its first heartbeat is still SIGKILLed by the reporting rank (found by its launch
environment, hang_exit.find_rank), so the job ends within the timeout, not after torchrun's 30 s from SIGTERM to
SIGKILL, which a stopped process ignores.

Real torchrun ranks exec'ed (POSAUG_ZYGOTE=0: a rank forked from the suite's zygote shows the zygote's
environment in /proc, which a deployed rank never does); ~10 CPU-s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from conftest import REPO

SCRIPT = "tests/distributed/stopped_before_heartbeat.py"


def test_a_rank_stopped_before_its_first_heartbeat_is_killed_by_the_reporter_and_the_job_ends_at_once(tmp_path):
    from pretrain.trainer.hang_exit import HANG_EXIT_CODE

    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="", POSAUG_ZYGOTE="0")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           SCRIPT, str(tmp_path / "run")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    took = time.time() - float((tmp_path / "run.stopped_at").read_text())  # from rank 1's stop: start-up not counted
    report = (tmp_path / "run" / "hang" / "report.txt").read_text()
    assert "rank 1 on" in report and "stopped reporting" in report, proc.stderr[-3000:]
    assert f"exitcode  : {HANG_EXIT_CODE}" in proc.stderr and "exitcode  : -9" in proc.stderr
    assert took < 2 + 20, f"{took:.1f} s: torchrun's SIGKILL ended rank 1, not the reporter\n{proc.stderr[-3000:]}"
