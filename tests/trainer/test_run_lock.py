"""The run directory's lock (pretrain.locks through RunLock): a second trainer is refused naming the holder's PID;
a dead holder's lock is gone with it. The holder is a real process; ~2 s."""

import os
import subprocess
import sys

import pytest

from conftest import REPO
from pretrain.trainer.run_dir import CheckpointError
from pretrain.trainer.run_lock import RunLock

HOLD = "import sys, time; from pretrain.trainer.run_lock import RunLock; lock = RunLock(sys.argv[1]); " \
       "lock.acquire(); print('held', flush=True); time.sleep(60)"


@pytest.fixture
def holder(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait()


def test_a_held_run_directory_is_refused_naming_the_holders_pid(holder, tmp_path):
    with pytest.raises(CheckpointError, match=f"in use by another training run \\(PID {holder.pid} on "):
        RunLock(tmp_path).acquire()


def test_a_killed_holders_lock_is_taken_over_and_its_line_replaced(holder, tmp_path):
    holder.kill()
    holder.wait()
    lock = RunLock(tmp_path)
    lock.acquire()
    try:
        assert (tmp_path / ".lock").read_text().startswith(f"PID {os.getpid()} on ")
    finally:
        lock.release()
