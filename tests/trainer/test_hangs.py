"""A hung rank ends the run within the train timeout: its name, host and last step in one line, every live
rank's stacks and flight recorder on record, status.json "hung", exit code 76, checkpoints intact, and a
restart resumes; a short stall is reported and survived; a resume with a changed model is refused untouched.

Real torchrun ranks on gloo (DP=2, the tiny preset on synthetic tokens); rank 1 is frozen with SIGSTOP, as a
rank stuck in a driver call or on a dead mount looks to its peers. Under load a tiny step takes seconds on
these 2 cores, hence a 20 s train timeout; ~1-2 min of CPU for the module.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, TINY_TRAIN, one_error_line, run_train, tensorboard_scalars

TIMEOUT_S = 20
MARGIN_S = 15  # the watchdog's ticks, the second look at the heartbeats, the stack files, the report
RUN = [*TINY_TRAIN, "data.synthetic=true", "schedule.global_batch_size=4", "schedule.micro_batch_size=2",
       "logging.eval_interval=1000", "checkpoint.save_interval=3", "checkpoint.keep_last=5",
       f"parallel.train_timeout_seconds={TIMEOUT_S}", "parallel.distributed_timeout_minutes=3"]


def start(run_dir: Path, iters: int, *extra: str) -> subprocess.Popen:
    """The DP=2 run under torchrun, stdout and stderr piped."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "pretrain",
               "train", "--set", *RUN, f"schedule.train_iters={iters}", f"checkpoint.save={run_dir}", *extra]
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rank_pid(launcher: subprocess.Popen, rank: int) -> int:
    """The pid of one torchrun worker, found by the RANK in its environment."""
    for child in Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split():
        if f"RANK={rank}".encode() in Path(f"/proc/{child}/environ").read_bytes().split(b"\0"):
            return int(child)
    raise AssertionError(f"no worker with RANK={rank} under torchrun {launcher.pid}")


def until_step(proc: subprocess.Popen, step: int, timeout: float = 240) -> list[str]:
    """Stdout lines up to the 'step N/' line."""
    lines, deadline = [], time.time() + timeout
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(f"step {step}/"):
            return lines
        if time.time() > deadline:
            break
    proc.kill()
    raise AssertionError(f"never reached step {step}:\n{''.join(lines)[-3000:]}")


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    """Rank 1 SIGSTOPped after step 4 of 100: (run dir, seconds from the stop to the end, stdout, stderr, code)."""
    run_dir = tmp_path_factory.mktemp("hung") / "run"
    proc = start(run_dir, 100)
    try:
        out = until_step(proc, 4)
        victim = rank_pid(proc, 1)
        os.kill(victim, signal.SIGSTOP)
        stopped = time.time()
        rest, err = proc.communicate(timeout=TIMEOUT_S + MARGIN_S + 60)
        ended = time.time() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
    return run_dir, ended, "".join(out) + rest, err, proc.returncode


@pytest.mark.slow
def test_a_hung_rank_ends_the_run_within_the_train_timeout_plus_a_margin(hung):
    _, ended, _, err, _ = hung
    assert ended <= TIMEOUT_S + MARGIN_S, err[-3000:]


@pytest.mark.slow
def test_the_hang_report_is_one_line_naming_the_silent_rank_its_host_and_last_step(hung):
    run_dir, _, _, err, _ = hung
    lines = [line for line in err.splitlines() if line.startswith("error: hang:")]
    assert len(lines) == 1, err[-3000:]
    assert f"rank 1 on {socket.gethostname()} (last completed step " in lines[0]
    assert "stopped reporting" in lines[0] and f"parallel.train_timeout_seconds" in lines[0]
    last = int(lines[0].split("(last completed step ")[1].split(")")[0])
    assert last >= 4
    assert str(run_dir / "hang") in lines[0]


@pytest.mark.slow
def test_the_live_rank_writes_its_stacks_and_flight_recorder_beside_the_report(hung):
    run_dir, _, _, _, _ = hung
    stacks = (run_dir / "hang" / "rank_0.txt").read_text()
    assert stacks.startswith(f"rank 0 of 2 on {socket.gethostname()}")
    assert 'Thread 0x' in stacks and "hang-watchdog" not in stacks.splitlines()[0]
    assert "pretrain/trainer/loop.py" in stacks  # the main thread, inside the training loop
    assert not (run_dir / "hang" / "rank_1.txt").exists()  # the stopped rank cannot write
    import pickle

    recorder = pickle.loads((run_dir / "hang" / "flight_recorder_rank_0.pkl").read_bytes())
    assert recorder["entries"] and recorder["entries"][-1]["profiling_name"].startswith("gloo:")


@pytest.mark.slow
def test_status_json_says_hung_with_the_line_and_runs_shows_it(hung):
    from pretrain.runs import inspect_run

    run_dir, _, _, err, _ = hung
    status = json.loads((run_dir / "status.json").read_text())
    line = next(line for line in err.splitlines() if line.startswith("error: hang:"))
    assert status["state"] == "hung" and status["error"] == line[len("error: "):]
    assert status["hung_ranks"] == [1] and status["hung_hosts"] == [socket.gethostname()]
    run = inspect_run(run_dir)
    assert run.state == "hung" and "rank 1 on" in run.detail


@pytest.mark.slow
def test_a_hang_exits_with_its_own_code_and_leaves_the_checkpoints_intact(hung):
    from pretrain.trainer.run_dir import checkpoints, verify
    from pretrain.trainer.watchdog import HANG_EXIT_CODE

    run_dir, _, _, err, _ = hung
    assert f"exitcode  : {HANG_EXIT_CODE}" in err, err[-3000:]  # torchrun's summary of the worker that reported
    assert err.count("Traceback") == 1  # torchrun's own ChildFailedError; none from the ranks
    saved = checkpoints(run_dir)
    assert saved and all(verify(path) is None for _, path in saved)


@pytest.mark.slow
def test_a_restart_after_a_hang_resumes_from_the_newest_checkpoint(hung, tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(hung[0], run_dir)
    newest = max(int(p.name[5:]) for p in run_dir.glob("iter_*") if p.name[5:].isdigit())
    proc = run_train([*RUN, f"schedule.train_iters={newest + 1}", f"checkpoint.save={run_dir}"], nproc=2)
    assert f"resumed from iteration {newest} (" in proc.stdout
    assert "the previous start's hang report and stacks are kept in" in proc.stdout
    assert (run_dir / "hang.1" / "report.txt").is_file() and not (run_dir / "hang").exists()
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"


@pytest.mark.slow  # a minute: the smallest start-up timeout
def test_a_rank_stuck_in_start_up_is_reported_after_the_distributed_timeout(tmp_path):
    proc = start(tmp_path / "run", 100, "parallel.distributed_timeout_minutes=1")
    try:
        for line in proc.stdout:  # rank 0 prints it just before its watchdog starts; rank 1 is still starting
            if line.startswith("config:"):
                break
        os.kill(rank_pid(proc, 1), signal.SIGSTOP)
        stopped = time.time()
        out, err = proc.communicate(timeout=60 + MARGIN_S + 60)
        ended = time.time() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
    # + torchrun's 30 s from SIGTERM to SIGKILL when rank 1 was stopped before its first heartbeat (no pid to end)
    assert ended <= 60 + MARGIN_S + 30, err[-3000:]
    line = next(line for line in err.splitlines() if line.startswith("error: hang:"))
    assert ("no progress for 60 s (parallel.distributed_timeout_minutes) in start-up after step 0: rank 1 on "
            f"{socket.gethostname()} (") in line
    assert "stopped reporting" in line and "step 1/" not in out


@pytest.mark.slow
def test_a_stall_shorter_than_the_timeout_is_reported_and_the_run_goes_on(tmp_path):
    proc = start(tmp_path / "run", 14, "logging.straggler_interval=2")
    try:
        until_step(proc, 4)
        victim = rank_pid(proc, 1)
        os.kill(victim, signal.SIGSTOP)
        time.sleep(5)
        os.kill(victim, signal.SIGCONT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    stalls = [line for line in out.splitlines() if line.startswith("stall: rank 1 on")]
    assert stalls, out[-3000:]
    # the longest: a loaded machine may starve a rank for a couple of seconds too, and that is reported as well
    seconds = max(float(line.split("could not run for ")[1].split(" s")[0]) for line in stalls)
    assert 4 <= seconds <= 15 and all("the run went on" in line for line in stalls)
    assert "step 14/14" in out and not (tmp_path / "run" / "hang").exists()
    longest = tensorboard_scalars(tmp_path / "run", "perf/longest_stall_s")
    assert sorted(longest) == [2, 4, 6, 8, 10, 12, 14] and 4 <= max(longest.values()) <= 15
    assert set(tensorboard_scalars(tmp_path / "run", "perf/straggler_ratio")) == set(longest)


@pytest.mark.slow  # a 3-step run first
def test_resuming_with_a_changed_model_is_refused_naming_each_field_and_config_yaml_is_untouched(tmp_path):
    run_dir = tmp_path / "run"
    run_train([*RUN, "schedule.train_iters=3", f"checkpoint.save={run_dir}"])
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    proc = run_train([*RUN, "schedule.train_iters=6", f"checkpoint.save={run_dir}", "model.num_layers=1",
                      "model.ffn_hidden_size=40"], check=False)
    line = one_error_line(proc)
    assert "model.num_layers: 4 in the checkpoint, 1 now" in line
    assert "model.ffn_hidden_size: 128 in the checkpoint, 40 now" in line
    assert "--set model.num_layers=4 model.ffn_hidden_size=128" in line and "checkpoint.save=<new run dir>" in line
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before


@pytest.mark.slow
def test_resuming_with_a_changed_schedule_and_recompute_still_resumes(tmp_path):
    run_dir = tmp_path / "run"
    run_train([*RUN, "schedule.train_iters=3", f"checkpoint.save={run_dir}"])
    proc = run_train([*RUN, "schedule.train_iters=4", f"checkpoint.save={run_dir}", "logging.log_interval=2",
                      "model.recompute_granularity=full", "model.recompute_method=uniform",
                      "model.recompute_num_layers=1"])
    assert "resumed from iteration 3 (" in proc.stdout


def test_the_timeouts_reach_every_process_group_megatrons_included(megatron_world):
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    from pretrain.trainer import distributed

    def timeouts() -> set[float]:
        groups = [dist.distributed_c10d._get_default_group(), parallel_state.get_data_parallel_group(),
                  parallel_state.get_tensor_model_parallel_group()]
        return {g._get_backend(torch.device("cpu")).options._timeout.total_seconds() for g in groups}

    # parallel.distributed_timeout_minutes' default, 10, and the grace that lets the watchdog report first
    assert timeouts() == {600.0 + distributed.PG_GRACE_S}
    try:
        distributed.set_timeout(42)
        assert timeouts() == {42.0 + distributed.PG_GRACE_S}
    finally:
        distributed.set_timeout(600)


def test_after_set_timeout_every_process_group_outlives_the_watchdog_by_the_grace(megatron_world, caplog):
    from torch.distributed import distributed_c10d as c10d

    from pretrain.trainer import distributed

    assert len(c10d._world.pg_map) >= 3  # the world and Megatron's groups, all of which the check reads
    try:
        with caplog.at_level("WARNING", logger="pretrain"):
            assert distributed.set_timeout(42) == []
        assert distributed.groups_off_timeout(42) == {} and not caplog.records
    finally:
        distributed.set_timeout(600)


def test_a_process_group_on_another_timeout_is_named_with_its_timeout(megatron_world):
    from datetime import timedelta

    import torch.distributed as dist

    from pretrain.trainer import distributed

    distributed.set_timeout(42)
    late = dist.new_group([0], timeout=timedelta(seconds=7))  # created after the loop set the timeouts
    try:
        off = distributed.groups_off_timeout(42)
        assert list(off.values()) == ["7 s"] and list(off)[0].endswith(" [0]")
        assert distributed.set_timeout(42) == [] and distributed.groups_off_timeout(42) == {}
    finally:
        dist.destroy_process_group(late)
        distributed.set_timeout(600)


@pytest.mark.parametrize("setting", ["parallel.train_timeout_seconds=0", "parallel.distributed_timeout_minutes=0"])
def test_a_timeout_that_is_not_positive_is_refused_naming_it(setting):
    from pretrain.trainer import config

    with pytest.raises(ValueError, match=setting.split("=")[0]):
        config.load(None, [setting])


def test_the_launchers_know_the_hang_exit_code():
    from pretrain.trainer.watchdog import HANG_EXIT_CODE

    common = (REPO / "slurm" / "common.sh").read_text()
    assert f"\nHANG_EXIT_CODE={HANG_EXIT_CODE}  # pretrain/trainer/watchdog.py" in common


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


def _watchdog_of(rank: int, world: int):
    """A Watchdog's reporting state without its thread or process group (for `_describe` alone)."""
    from pretrain.trainer.watchdog import Watchdog

    watchdog = Watchdog.__new__(Watchdog)
    watchdog.rank, watchdog.world, watchdog.host = rank, world, f"node{rank}"
    watchdog.hosts = {r: f"node{r}" for r in range(world)}
    watchdog.hang_dir, watchdog.store_problem = Path("run/hang"), "the store does not answer"
    return watchdog


def _beat(beat: int, step: int, in_collective: bool = True) -> dict:
    return {"beat": beat, "step": step, "in_collective": in_collective}


def test_a_rank_whose_heartbeat_stopped_is_named_with_its_host_and_last_step():
    first = {0: _beat(5, 9), 1: _beat(7, 8), 2: _beat(3, 9)}
    second = {0: _beat(8, 9), 1: _beat(7, 8), 2: _beat(6, 9)}
    line, named, stopped = _watchdog_of(0, 3)._describe(9, "step 10", "parallel.train_timeout_seconds", 20, first,
                                                        second)
    assert named == stopped == [1]
    assert line == ("hang: no progress for 20 s (parallel.train_timeout_seconds) in step 10 after step 9: rank 1 on "
                    "node1 (last completed step 8) stopped reporting; stacks of the live ranks in run/hang")


def test_with_every_heartbeat_alive_the_rank_outside_any_collective_is_the_one_stuck():
    first = {0: _beat(1, 9), 1: _beat(1, 9, in_collective=False)}
    second = {0: _beat(4, 9), 1: _beat(4, 9, in_collective=False)}
    line, named, stopped = _watchdog_of(0, 2)._describe(9, "step 10", "s", 20, first, second)
    assert named == [1] and stopped == []
    assert "rank 1 on node1 (last completed step 9) is stuck outside any collective while the others wait" in line


def test_with_every_rank_alive_in_a_collective_the_report_says_so():
    beats = {0: _beat(1, 9), 1: _beat(1, 9)}
    line, named, _ = _watchdog_of(1, 2)._describe(9, "step 10", "s", 20, beats, {r: _beat(2, 9) for r in beats})
    assert named == [] and "every rank still reports and waits in a collective" in line


def test_a_rank_cut_off_from_the_store_names_the_store_host_rank_0():
    line, named, _ = _watchdog_of(1, 2)._describe(9, "step 10", "s", 20, None, None)
    assert named == [0]
    assert "rank 1 on node1 cannot reach the other ranks: the store does not answer (rank 0 on node0 hosts it" in line
