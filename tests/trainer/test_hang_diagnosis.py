"""Who a hang report names, from the heartbeats alone (hang_diagnosis.py); the identity check before the watchdog
kills a silent rank and the search for one that never sent a heartbeat (hang_exit.py). The end-to-end hangs
through real processes are in test_hangs.py.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def _observer(rank: int, world: int):
    """A rank's view for `diagnose`, every host known from earlier heartbeats, the store not answering."""
    from pretrain.trainer.hang_diagnosis import Observer

    return Observer(rank, world, f"node{rank}", Path("run/hang"), {r: f"node{r}" for r in range(world)},
                    store_problem="the store does not answer", store_address="10.0.0.1:29500")


def _beat(beat: int, step: int, phase: str = "optimizer", entered: int = 2, microbatch: int = 4) -> dict:
    return {"beat": beat, "step": step, "phase": phase, "entered": entered, "microbatch": microbatch}


def _diagnose(rank: int, world: int, first: dict | None, second: dict | None):
    from pretrain.trainer.hang_diagnosis import diagnose

    return diagnose(_observer(rank, world), 9, "step 10", "parallel.train_timeout_seconds", 20, first, second)


def test_a_rank_whose_heartbeat_stopped_is_named_with_its_host_and_last_step():
    first = {0: _beat(5, 9), 1: _beat(7, 8), 2: _beat(3, 9)}
    second = {0: _beat(8, 9), 1: _beat(7, 8), 2: _beat(6, 9)}
    line, named, stopped = _diagnose(0, 3, first, second)
    assert named == stopped == [1]
    assert line == ("hang: no progress for 20 s (parallel.train_timeout_seconds) in step 10 after step 9: rank 1 on "
                    "node1 (last completed step 8, in optimizer) stopped reporting; stacks of the live ranks in "
                    "run/hang")


def test_a_live_rank_at_an_earlier_microbatch_than_the_others_is_the_one_stuck():
    # NCCL-shaped: the others left the forward-backward at once and wait at the optimizer's host sync
    first = {0: _beat(1, 9), 1: _beat(1, 9, "forward-backward", 1, 2), 2: _beat(1, 9)}
    second = {0: _beat(4, 9), 1: _beat(4, 9, "forward-backward", 1, 2), 2: _beat(4, 9)}
    line, named, stopped = _diagnose(0, 3, first, second)
    assert named == [1] and stopped == []
    assert ("rank 1 on node1 (last completed step 9, in forward-backward at microbatch 2) is behind the others, "
            "which wait for it") in line


def test_a_live_rank_a_step_behind_is_the_one_stuck_whatever_its_phase():
    second = {0: _beat(4, 9, "forward-backward", 1, 1), 1: _beat(4, 8, "save", 3, 0)}
    _, named, _ = _diagnose(0, 2, {r: _beat(1, 9) for r in second}, second)
    assert named == [1]


def test_every_rank_behind_together_is_named():
    second = {0: _beat(4, 9), 1: _beat(4, 9, "forward-backward", 1, 1), 2: _beat(4, 9, "forward-backward", 1, 1)}
    line, named, _ = _diagnose(0, 3, {r: _beat(1, 9) for r in second}, second)
    assert named == [1, 2] and "are behind the others, which wait for them" in line


def test_with_every_rank_alive_at_the_same_point_the_report_says_every_rank_waits_there():
    beats = {0: _beat(1, 9), 1: _beat(1, 9)}
    line, named, _ = _diagnose(1, 2, beats, {r: _beat(2, 9) for r in beats})
    assert named == []
    assert "every rank still reports and waits at the same place (last completed step 9, in optimizer)" in line


def test_the_phases_of_a_step_order_themselves_as_the_loop_enters_them():
    from pretrain.trainer.hang_diagnosis import StepCounters, point

    progress, seen = StepCounters(), []
    for phase in ("forward-backward", "gradient sync", "optimizer"):
        progress.enter(phase)
        seen.append(point(progress.record()))
    progress.completed(1)
    for phase in ("validation", "after the validation", "save", "after the save", "forward-backward"):
        progress.enter(phase)
        seen.append(point(progress.record()))
    progress.microbatch += 1
    seen.append(point(progress.record()))
    assert seen == sorted(seen) and len(set(seen)) == len(seen)


def test_a_rank_cut_off_from_the_store_names_the_store_host_rank_0():
    line, named, _ = _diagnose(1, 2, None, None)
    assert named == [0]
    assert ("rank 1 on node1 cannot reach the other ranks: the store does not answer (the store at 10.0.0.1:29500 "
            "is hosted by rank 0 on node0: rank 0 stopped") in line


def test_a_rank_cut_off_from_the_store_of_torchruns_agent_names_no_rank():
    from dataclasses import replace

    from pretrain.trainer.hang_diagnosis import diagnose

    line, named, _ = diagnose(replace(_observer(1, 2), agent_store=True), 9, "step 10", "s", 20, None, None)
    assert named == [] and "hosted by torchrun's agent" in line


def test_the_start_time_of_a_process_is_read_from_proc_and_none_once_it_ended():
    from pretrain.trainer.hang_exit import start_time

    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        assert start_time(sleeper.pid) == int(Path(f"/proc/{sleeper.pid}/stat").read_text().split()[21])
    finally:
        sleeper.kill()
        sleeper.wait()
    assert start_time(sleeper.pid) is None


def test_a_heartbeat_whose_pid_is_now_another_process_is_not_killed():
    from pretrain.trainer.hang_exit import kill_rank, start_time

    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        record = {"host": socket.gethostname(), "pid": sleeper.pid, "start_time": start_time(sleeper.pid) - 1}
        refused = kill_rank(record)
        assert refused and f"pid {sleeper.pid} is another process now" in refused
        time.sleep(0.2)
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_heartbeat_whose_pid_is_still_its_process_is_killed():
    from pretrain.trainer.hang_exit import kill_rank, start_time

    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        assert kill_rank({"host": socket.gethostname(), "pid": sleeper.pid,
                          "start_time": start_time(sleeper.pid)}) is None
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_heartbeat_from_another_host_is_not_killed():
    from pretrain.trainer.hang_exit import kill_rank, start_time

    record = {"host": "elsewhere", "pid": os.getpid(), "start_time": start_time(os.getpid())}
    assert kill_rank(record) == "not killed: on elsewhere, not on this host"


def _launched(monkeypatch, rank: int, same_job: bool, command: list[str]) -> subprocess.Popen:
    """`command` started as torchrun starts rank `rank` of this process's job (rank 0) or of another job; the port
    is this test process's own, so xdist's other workers (running these tests too) are other jobs."""
    port = 20000 + 2 * (os.getpid() % 10000)
    for key, value in {"RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    env = {**os.environ, "RANK": str(rank), "MASTER_PORT": str(port if same_job else port + 1)}
    return subprocess.Popen(command, env=env)


def test_a_rank_stopped_before_its_first_heartbeat_is_found_by_its_launch_environment_and_killed(monkeypatch):
    from pretrain.trainer.hang_exit import find_rank, kill_rank

    rank_1 = _launched(monkeypatch, 1, True, ["sleep", "60"])
    try:
        os.kill(rank_1.pid, signal.SIGSTOP)
        record = find_rank(1)
        assert record and record["pid"] == rank_1.pid
        assert kill_rank(record) is None
        assert rank_1.wait(timeout=10) == -signal.SIGKILL
    finally:
        rank_1.kill()
        rank_1.wait()


def test_the_same_rank_of_another_job_on_the_host_is_not_found(monkeypatch):
    from pretrain.trainer.hang_exit import find_rank

    other_job = _launched(monkeypatch, 1, False, ["sleep", "60"])
    try:
        time.sleep(0.2)  # exec'd: /proc shows sleep's environment, not a fork of this process's
        assert find_rank(1) is None
    finally:
        other_job.kill()
        other_job.wait()


def test_the_rank_found_is_the_process_whose_children_inherited_its_launch_environment(monkeypatch):
    from pretrain.trainer.hang_exit import find_rank, kill_tree

    rank_1 = _launched(monkeypatch, 1, True, ["bash", "-c", "sleep 60 & wait"])
    try:
        time.sleep(0.3)
        record = find_rank(1)
        assert record and record["pid"] == rank_1.pid
    finally:
        kill_tree(rank_1.pid)
        rank_1.wait()
