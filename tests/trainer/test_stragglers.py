"""The straggler report names the slow rank, not the peers that wait for it: a rank's own time is its step time
less its time blocked in data-, pipeline- and tensor-parallel communication.

Unit tests on the timing seam, and one real PP=2 torchrun run on gloo in which rank 1 is slowed from outside
(SIGSTOP for 0.2 s whenever it is found computing, as a slower device): its pipeline peer, rank 0, waits for it
in every receive and must not be named. ~1-2 min of CPU.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

import zygote
from conftest import REPO, TINY_TRAIN, tensorboard_scalars


class _Clock:
    """A constructed clock for stragglers.py: a step's compute and waits advance it by exact amounts."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    from pretrain.trainer import stragglers

    fake = _Clock()
    monkeypatch.setattr(stragglers, "time", fake)
    return fake


def _step_times(finalize=lambda: None):
    from pretrain.trainer.stragglers import StepTimes

    engine = SimpleNamespace(config=SimpleNamespace(finalize_model_grads_func=finalize))
    return StepTimes(engine), engine


def test_time_blocked_in_communication_is_not_a_ranks_own_time(clock):
    from pretrain.trainer.stragglers import timed_communication

    times, engine = _step_times(finalize=lambda: clock.spend(0.2))  # the DP gradient reduction
    receive = timed_communication(lambda: clock.spend(0.3))  # a pipeline receive waiting for a slow neighbour
    times.begin()
    clock.spend(0.1)  # compute
    receive()
    engine.config.finalize_model_grads_func()
    clock.spend(0.05)  # the optimizer
    times.end()
    assert times.steps == 1 and times.own_s == pytest.approx(0.15)


def test_the_start_up_step_is_not_a_ranks_own_time(clock):
    times, _ = _step_times()
    times.begin()
    clock.spend(5.0)  # allocations and first loads
    times.end(start_up=True)
    times.begin()
    clock.spend(0.1)
    times.end()
    assert times.steps == 1 and times.own_s == pytest.approx(0.1)


def test_a_window_of_only_the_start_up_step_names_no_rank_and_reports_only_stalls():
    from pretrain.trainer.stragglers import Gathered

    window = Gathered([0.0, 0.0], [0, 0], [[], [(3.0, 1)]], ["a", "b"])
    assert [line.split(" could")[0] for line in window.lines(2, 1, 1.2, 60)] == ["stall: rank 1 on b"]
    assert window.scalars() == {"perf/longest_stall_s": 3.0}


def test_nested_timed_communication_is_taken_out_once(clock):
    from pretrain.trainer.stragglers import timed_communication

    times, _ = _step_times()
    inner = timed_communication(lambda: clock.spend(0.2))
    outer = timed_communication(lambda: (inner(), clock.spend(0.1)))
    times.begin()
    clock.spend(0.3)
    outer()
    times.end()
    assert times.own_s == pytest.approx(0.3)


def test_a_slow_stage_is_named_and_not_the_peer_that_waits_for_it(clock):
    from pretrain.trainer.stragglers import Gathered, timed_communication

    own = []
    for compute, wait in ((0.1, 0.3), (0.4, 0.0)):  # rank 0 waits 0.3 s in a receive for rank 1's 0.4 s compute
        times, _ = _step_times()
        receive = timed_communication(lambda: clock.spend(wait))
        times.begin()
        clock.spend(compute)
        receive()
        times.end()
        own.append(times.own_s)
    window = Gathered(own, [1, 1], [[], []], ["a", "b"])
    assert window.slowest == 1 and window.lines(1, 1, 1.5, 60)[0].startswith("straggler: rank 1 on b ")


def test_megatrons_pipeline_sends_and_receives_and_tensor_parallel_collectives_are_timed():
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
    from megatron.core.tensor_parallel import mappings

    from pretrain.trainer.stragglers import _TP_COLLECTIVES

    _step_times()
    assert getattr(P2PCommunicator._communicate, "_posaug_timed", False)
    assert all(getattr(getattr(mappings, name), "_posaug_timed", False) for name in _TP_COLLECTIVES)
    _step_times()  # a second engine in one process wraps nothing twice
    assert not getattr(P2PCommunicator._communicate.__wrapped__, "_posaug_timed", False)


def test_the_straggler_report_names_the_slowest_rank_its_ratio_to_the_median_and_each_stall():
    from pretrain.trainer.stragglers import Gathered

    window = Gathered([1.0, 1.1, 3.0, 0.9], [10] * 4, [[], [(5.2, 17)], [], []], ["a", "b", "c", "d"])
    lines = window.lines(11, 20, threshold=1.5, train_timeout_s=60)
    assert lines[0].startswith("straggler: rank 2 on c spent 3.00 s outside collectives in steps 11-20, 2.86x the "
                               "median rank (1.05 s")
    assert lines[1].startswith("stall: rank 1 on b could not run for 5.2 s during step 17")
    assert window.scalars() == {"perf/straggler_ratio": pytest.approx(3.0 / 1.05), "perf/slowest_rank": 2.0,
                                "perf/longest_stall_s": 5.2}
    assert Gathered([1.0, 1.2], [10, 10], [[], []], ["a", "b"]).lines(1, 10, 1.5, 60) == []  # below the threshold


def _running(pid: int) -> bool:
    """The process's main thread is on a CPU or runnable (state R), not asleep in a receive."""
    with open(f"/proc/{pid}/task/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0] == "R"


def _throttle(pid: int, done: threading.Event) -> None:
    """Until `done`, stop the process for 0.2 s whenever it is found computing, as a slower device would be.

    Stopped at random instead, a rank is often caught waiting in a pipeline receive: that time is rightly not
    its own, and in a window of a few steps the slow rank then looked no slower than its peer.
    """
    while not done.is_set():
        try:
            if not _running(pid):
                time.sleep(0.002)
                continue
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.2)
            os.kill(pid, signal.SIGCONT)
        except (ProcessLookupError, FileNotFoundError):
            return
        time.sleep(0.02)


@pytest.mark.slow
def test_a_slowed_pipeline_stage_is_named_and_not_its_waiting_peer(tmp_path):
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "pretrain",
               "train", "--set", *TINY_TRAIN, "data.synthetic=true", "parallel.pipeline_model_parallel_size=2",
               "schedule.train_iters=12", "logging.eval_interval=1000", "checkpoint.save_interval=1000",
               "logging.straggler_interval=4", "logging.straggler_threshold=1.2", f"checkpoint.save={run_dir}"]
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = threading.Event()
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("step 1/"):  # start-up over: slow the second stage from now on
                break
        victim = _rank_pid(proc.pid, 1)
        throttler = threading.Thread(target=_throttle, args=(victim, done), daemon=True)
        throttler.start()
        out, err = proc.communicate(timeout=400)
    finally:
        done.set()
        if proc.poll() is None:
            proc.kill()
        for pid in _worker_pids(proc.pid):
            os.kill(pid, signal.SIGCONT)
    out = "".join(lines) + out
    assert proc.returncode == 0, err[-3000:]
    named = [line for line in out.splitlines() if line.startswith("straggler: ")]
    assert named and all(line.startswith("straggler: rank 1 on ") for line in named), out[-3000:]
    assert tensorboard_scalars(run_dir, "perf/slowest_rank") == {4: 1.0, 8: 1.0, 12: 1.0}


def _worker_pids(launcher: int) -> list[int]:
    try:
        return [int(c) for c in open(f"/proc/{launcher}/task/{launcher}/children").read().split()]
    except OSError:
        return []


def _rank_pid(launcher: int, rank: int) -> int:
    for child in _worker_pids(launcher):
        if zygote.environ_of(child).get("RANK") == str(rank):
            return child
    raise AssertionError(f"no worker with RANK={rank} under torchrun {launcher}")
