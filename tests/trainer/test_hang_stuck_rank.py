"""A rank whose main thread is stuck in its own work while its watchdog thread still reports (as in a driver
call, or a read from a dead mount) is named from the progress counters alone: it is behind the others.

Real torchrun ranks on gloo (DP=2, 4 microbatches per rank); rank 1's main thread is put to sleep in its next
transformer-layer forward (compute, not a collective) by a SIGUSR2 handler that only this test installs (a
sitecustomize.py on the ranks' PYTHONPATH). ~1 min of CPU.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import REPO
from test_hangs import MARGIN_S, RUN, TIMEOUT_S, rank_pid, until_step

HOOK = '''
import signal, sys, time


def _stick(*_):  # Python runs signal handlers on the main thread: its trace function then applies to it
    def trace(frame, event, arg):
        if event == "call" and "/megatron/core/transformer/" in frame.f_code.co_filename:
            time.sleep(3600)
    sys.settrace(trace)


signal.signal(signal.SIGUSR2, _stick)
'''


@pytest.mark.slow
def test_a_live_rank_stuck_in_its_own_work_is_named_as_behind_the_others(tmp_path):
    from pretrain.trainer.watchdog import HANG_EXIT_CODE

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{hook}", CUDA_VISIBLE_DEVICES="",
               POSAUG_ZYGOTE="0")  # exec'ed: a forked rank would not run the hook's sitecustomize
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "pretrain",
               "train", "--set", *RUN, "schedule.global_batch_size=8", "schedule.micro_batch_size=1",
               "schedule.train_iters=100", f"checkpoint.save={run_dir}", "checkpoint.save_interval=1000"]
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        until_step(proc, 4)
        os.kill(rank_pid(proc, 1), signal.SIGUSR2)
        stuck = time.time()
        out, err = proc.communicate(timeout=TIMEOUT_S + MARGIN_S + 60)
        ended = time.time() - stuck
    finally:
        if proc.poll() is None:
            proc.kill()
    assert ended <= TIMEOUT_S + MARGIN_S, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("error: hang:")]
    assert len(lines) == 1, err[-3000:]
    assert re.search(rf"rank 1 on {socket.gethostname()} \(last completed step \d+, in [a-z -]+(at microbatch \d+)?\) "
                     r"is behind the others, which wait for it", lines[0]), lines[0]
    assert f"exitcode  : {HANG_EXIT_CODE}" in err
    assert json.loads((run_dir / "status.json").read_text())["hung_ranks"] == [1]
