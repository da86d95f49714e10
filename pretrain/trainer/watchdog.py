"""The hang watchdog: a thread per rank that ends a run in which no training step completes in time.

Every rank runs one `Watchdog` thread. The training loop tells it where it is (`progress` after each step,
`phase` around start-up, checkpoint saves and validation), which sets a deadline: the first step, saves and
validation get `parallel.distributed_timeout_minutes`, every later step `parallel.train_timeout_seconds`.

A stuck collective blocks the main thread, so the ranks talk over a side channel: each thread publishes a
heartbeat (a counter; the main thread's progress counters: last completed step, phase, microbatch; its host,
pid and process start time) every tick to the torch.distributed rendezvous store (the TCPStore at
MASTER_ADDR:MASTER_PORT, hosted by torchrun's agent or by rank 0 under srun), through a client of its own whose
every operation is bounded in time (heartbeats.py). Starting the watchdog needs no collective, so a peer stuck
anywhere after it started is caught. A hang before that (process-group creation, the resume plan's broadcast)
ends by the process groups' own timeout, `parallel.distributed_timeout_minutes`, without this report. When a
rank's deadline passes:

1. it writes the Python stacks of all its threads to `<run>/hang/rank_<N>.txt` (faulthandler) and torch's
   flight recorder (the last collectives of every group, NCCL or gloo) to `flight_recorder_rank_<N>.pkl`;
2. it reads every rank's heartbeat twice, a few ticks apart: a rank whose counter did not move stopped
   reporting (stopped, dead, or cut off from the store's host); with none such, the ranks behind the others
   (lowest step, phase, microbatch) are the ones stuck, and with all at one point every rank waits there
   (hang_diagnosis.py; no stack frame is read, so this holds for NCCL, whose collectives return at once, as for
   gloo). A rank that cannot reach the store skips the second look: under srun the store's host is rank 0 (at
   MASTER_ADDR), which it names;
3. the first live rank to create `<run>/hang/reporter` (O_EXCL; ranks that cannot reach the store try a few
   ticks later) prints one line naming those ranks, their hosts and progress, writes `report.txt`, and sets
   `status.json` to "hung" with that line; it SIGKILLs silent ranks on its own host whose pid still has the
   start time of their heartbeat, or, stopped before their first one, that its launch environment names
   (hang_exit.py; a SIGSTOPped process ignores the launcher's SIGTERM, and torchrun waits 30 s before its SIGKILL);
4. every live rank exits with HANG_EXIT_CODE once the report exists, so the job ends within the timeout plus a
   few ticks. Checkpoints are untouched: a save cut short leaves only an iter_N.tmp, which resume ignores.

The thread also notices when it could not run for a while (its sleep overran: the process was stopped, or
starved): `take_stalls` hands these to the straggler report (stragglers.py), and the time is added to this rank's
deadline, so a stall is reported while the run goes on, however long it was: a whole job suspended and resumed
(SIGSTOP / SIGCONT to every rank, as `scontrol suspend` does) continues. A rank stopped alone still ends the
run: its peers, which kept running, reach their deadlines and name it.

nvidia-resiliency-ext (0.4.1, checked) is not used: its heartbeats and section timeouts need its own launcher
(ft_launcher, a torchrun replacement hosting a rank-monitor process per rank), which the srun-per-GPU launch
model of slurm/common.sh has no place for; its straggler detector times CUDA kernels through CUPTI (GPU only);
its in-process restart aborts NCCL communicators (gloo cannot be aborted), so none of it runs on the CPU
machines this project is developed and tested on.
"""

from __future__ import annotations

# Reaches into library internals (checked against torch 2.13):
# - torch._C._distributed_c10d._dump_fr_trace: the flight recorder's dump (torch's own dump-on-timeout path
#   writes it only for NCCL and only to TORCH_FR_DUMP_TEMP_FILE; this writes it beside the stacks for both).

import faulthandler
import os
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch.distributed as dist

from pretrain.trainer.hang_diagnosis import Observer, StepCounters, Verdict, diagnose
from pretrain.trainer.hang_exit import HANG_EXIT_CODE, exit_now, find_rank, identity, kill_rank
from pretrain.trainer.heartbeats import STORE_TIMEOUT_S, Heartbeats

__all__ = ["HANG_EXIT_CODE", "Watchdog", "exit_now", "set_aside_previous"]

HANG_DIR = "hang"
REPORT = "report.txt"
STALL_MIN_S = 2.0  # a tick that overran by this much is a stall worth reporting


def _tick(train_timeout_s: float) -> float:
    return min(1.0, max(0.05, train_timeout_s / 20))


class Watchdog:
    """One thread per rank: heartbeats to the rendezvous store, a deadline per phase, the hang report."""

    def __init__(self, run_dir: Path, total_iters: int, startup_timeout_s: float, train_timeout_s: float) -> None:
        self.run_dir, self.hang_dir = Path(run_dir), Path(run_dir) / HANG_DIR
        self.total_iters = total_iters
        self.startup_timeout_s, self.train_timeout_s = startup_timeout_s, train_timeout_s
        self.tick = _tick(train_timeout_s)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.host = socket.gethostname()
        # no collective here: a peer stuck before it would leave this rank unwatched. Who is where comes with
        # the heartbeats.
        self.me = identity()
        self.observer = Observer(self.rank, self.world, self.host, self.hang_dir, {self.rank: self.host},
                                 store_address=f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
                                 agent_store=os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
                                 per_node=int(os.environ.get("LOCAL_WORLD_SIZE") or 0))
        self.step = 0
        self.counters = StepCounters()  # the loop and the engine write these; this thread publishes them
        self.beats = Heartbeats(self.rank, self.world, self.counters, self.me)
        self.phase_name, self.setting = "start-up", "parallel.distributed_timeout_minutes"
        self.timeout_s = startup_timeout_s
        self.deadline = time.monotonic() + startup_timeout_s
        self.stalls: list[tuple[float, int]] = []  # (seconds, step during which it happened)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # a completed step is published at once, not at the next tick
        self.fired = False  # the deadline passed: the thread is writing the report and will end the process
        self._thread = threading.Thread(target=self._run, name="hang-watchdog", daemon=True)

    # ---- main thread ----------------------------------------------------------------------------------
    def start(self) -> "Watchdog":
        """Publish the first heartbeat and start the thread (the start-up deadline runs from construction)."""
        self.beats.publish()
        self._thread.start()
        return self

    def progress(self, step: int) -> None:
        """A training step completed: the next must complete within the train timeout."""
        with self._lock:
            self.step = step
            self.counters.completed(step)
            self.phase_name, self.setting = f"step {step + 1}", "parallel.train_timeout_seconds"
            self.timeout_s = self.train_timeout_s
            self.deadline = time.monotonic() + self.train_timeout_s
        self._wake.set()

    @contextmanager
    def phase(self, name: str, kind: str) -> Iterator[None]:
        """A section allowed the long timeout (`kind` "save" or "validation"); the train timeout runs again after."""
        self.counters.enter(kind)
        with self._lock:
            previous = self.phase_name
            self.phase_name, self.setting = name, "parallel.distributed_timeout_minutes"
            self.timeout_s = self.startup_timeout_s
            self.deadline = time.monotonic() + self.startup_timeout_s
        try:
            yield
        finally:
            self.counters.enter(f"after the {kind}")
            with self._lock:
                self.phase_name, self.setting = previous, "parallel.train_timeout_seconds"
                self.timeout_s = self.train_timeout_s
                self.deadline = time.monotonic() + self.train_timeout_s

    def take_stalls(self) -> list[tuple[float, int]]:
        """Stalls of this rank since the last call: (seconds it could not run, the step it was in)."""
        with self._lock:
            stalls, self.stalls = self.stalls, []
        return stalls

    def stop(self, failed: bool = False) -> None:
        """End the thread (training is over, or failed). After a hang the process ends here with HANG_EXIT_CODE:
        the watchdog's own exit, or, for a rank whose collective broke because a hung peer was ended, this one."""
        with self._lock:
            self._stop.set()
            fired = self.fired
        self._wake.set()
        if fired:
            self._thread.join()  # the thread calls os._exit; a failing collective must not print over the report
        if failed and (self.hang_dir / REPORT).exists():
            exit_now()
        if self._thread.is_alive():
            self._thread.join(timeout=5 * STORE_TIMEOUT_S)

    # ---- the thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        self.beats.reserve()  # before any read here: a read of a key no rank wrote would wait out the store's timeout
        checked, excused = time.monotonic(), 0.0
        while True:
            self._wake.wait(self.tick)
            self._wake.clear()
            if self._stop.is_set():
                return
            # A stopped process overruns whatever this thread was doing when the signal came: its sleep, or a
            # store call that then succeeded (measured only over the sleep, a SIGSTOP landing in a heartbeat made
            # the job's resume look like a hang). Time in a store call that failed is the store's, not a stall.
            overrun = time.monotonic() - checked - self.tick - excused
            with self._lock:
                if overrun >= STALL_MIN_S:
                    self.stalls.append((overrun, self.step + 1))
                    # Time this process could not run is not its code hanging: a job suspended whole (SLURM's
                    # `scontrol suspend` is a SIGSTOP to every rank) must go on once resumed. A rank stopped
                    # alone is still named by its peers, whose deadlines kept running.
                    self.deadline += overrun
                self.fired = time.monotonic() > self.deadline and not self._stop.is_set()
            checked = time.monotonic()
            self.beats.publish()
            if self.fired:
                self._hang()
                return
            if 0 not in self.beats.records and self.rank != 0 and self.world > 1:
                self._learn_store_host()
            excused = time.monotonic() - checked if self.beats.problem else 0.0

    def _learn_store_host(self) -> None:
        """Rank 0's heartbeat, read once while the store answers: under srun rank 0 hosts the store, and once it
        stopped, its host, pid and start time could no longer be read."""
        if self.beats.read([0]):
            self.observer.hosts[0] = self.beats.records[0]["host"]

    def _read(self) -> dict[int, dict] | None:
        found = self.beats.read()
        if found is not None:
            self.observer.hosts.update({rank: record["host"] for rank, record in found.items()})
        return found

    def _hang(self) -> None:
        """Stacks, flight recorder, the report (one rank), status.json, and the exit of this process."""
        with self._lock:
            step, phase, setting, timeout_s = self.step, self.phase_name, self.setting, self.timeout_s
        try:
            self.hang_dir.mkdir(parents=True, exist_ok=True)
            self._write_stacks(step, phase)
            self._write_flight_recorder()
            self.beats.publish()  # the stacks and the flight recorder can outlast a peer's two looks under load
            first = self._read()
            second = None
            if first is not None:  # without the store a second look would only wait out more store timeouts
                self._pause(3 * self.tick)  # a few ticks, so a live rank's counter moves at least once
                second = self._read()
            line, named, stopped = self._describe(step, phase, setting, timeout_s, first, second)
            if second is None:  # this rank knows least: a rank that reads the heartbeats elects itself 3 ticks
                time.sleep(3 * self.tick + STORE_TIMEOUT_S)  # after its deadline and a read (a partition's far side)
            if self._elected():
                self._report(line, named, stopped)
            else:
                deadline = time.monotonic() + 6 * STORE_TIMEOUT_S + 10 * self.tick
                while not (self.hang_dir / REPORT).exists() and time.monotonic() < deadline:
                    self._pause(self.tick)
        except BaseException as error:  # the exit below must happen whatever went wrong on the way
            print(f"warning: rank {self.rank}: the hang report failed: {type(error).__name__}: {error}",
                  file=sys.stderr, flush=True)
        finally:
            exit_now()

    def _pause(self, seconds: float) -> None:
        """Sleep, publishing this rank's heartbeat every tick: a rank writing or awaiting the report is live, and a
        peer that looks twice meanwhile must not call it stopped (under load the stuck-rank test once named the
        stuck rank "stopped reporting": its own report path had outlasted the other rank's two looks)."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(self.tick, left))
            self.beats.publish()

    def _write_stacks(self, step: int, phase: str) -> None:
        path = self.hang_dir / f"rank_{self.rank}.txt"
        with open(path, "w") as handle:
            handle.write(f"rank {self.rank} of {self.world} on {self.host}, pid {os.getpid()}: last completed step "
                         f"{step}, in {phase}, at {time.strftime('%Y-%m-%d %H:%M:%S')}; the Python stacks of all "
                         f"threads:\n")
            handle.flush()
            faulthandler.dump_traceback(file=handle, all_threads=True)

    def _write_flight_recorder(self) -> None:
        """torch's record of the last collectives (NCCL or gloo), beside the stacks; nothing where torch has none."""
        try:
            from torch._C._distributed_c10d import _dump_fr_trace
        except ImportError:
            return
        try:
            dump = _dump_fr_trace(includeStackTraces=True)
        except RuntimeError:  # the recorder was off (TORCH_FR_BUFFER_SIZE=0)
            return
        (self.hang_dir / f"flight_recorder_rank_{self.rank}.pkl").write_bytes(dump)

    def _describe(self, step: int, phase: str, setting: str, timeout_s: float, first: dict | None,
                  second: dict | None) -> Verdict:
        """The one-line report, the ranks it names, and those of them that stopped reporting."""
        self.observer.store_problem = self.beats.problem
        return diagnose(self.observer, step, phase, setting, timeout_s, first, second)

    def _elected(self) -> bool:
        try:
            os.close(os.open(self.hang_dir / "reporter", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return True
        except FileExistsError:
            return False

    def _report(self, line: str, named: list[int], stopped: list[int]) -> None:
        from pretrain.trainer.metrics import write_status
        from pretrain.trainer.run_dir import latest_iteration

        live = [r for r in range(self.world) if r not in stopped]
        deadline = time.monotonic() + 2 * STORE_TIMEOUT_S
        while time.monotonic() < deadline and not all((self.hang_dir / f"rank_{r}.txt").exists() for r in live):
            self._pause(self.tick)  # the other live ranks' stacks, before anything can end them
        hosts = sorted({self.observer.host_of(r) for r in named} - {"an unknown host"})
        write_status(self.run_dir, "hung", self.step, self.total_iters, error=line, hung_ranks=named,
                     hung_hosts=hosts, checkpoint_iteration=latest_iteration(self.run_dir) or 0)
        tmp = self.hang_dir / f"{REPORT}.tmp"
        tmp.write_text(f"{line}\nranks: {' '.join(map(str, named))}\nhosts: {' '.join(hosts)}\n")
        os.replace(tmp, self.hang_dir / REPORT)
        print(f"error: {line}", file=sys.stderr, flush=True)
        for rank in (r for r in stopped if r != self.rank):  # a stopped process ignores SIGTERM: end it now
            record = self.beats.records.get(rank)
            if not (record or {}).get("pid"):  # stopped before its first heartbeat
                record = find_rank(rank)
            if record and record.get("host") == self.host:
                refused = kill_rank(record)
                if refused:
                    note = f"rank {rank} (pid {record.get('pid')} on {self.host}) {refused}"
                    with open(self.hang_dir / REPORT, "a") as handle:
                        handle.write(f"kill: {note}\n")
                    print(f"warning: {note}", file=sys.stderr, flush=True)


def set_aside_previous(run_dir: Path) -> str | None:
    """Move an earlier start's hang/ directory to hang.N (kept as evidence); a note saying so, or None."""
    previous = Path(run_dir) / HANG_DIR
    if not previous.is_dir():
        return None
    n = 1
    while (target := previous.with_name(f"{HANG_DIR}.{n}")).exists():
        n += 1
    os.replace(previous, target)
    return f"the previous start's hang report and stacks are kept in {target}"
