"""The hang watchdog: a thread per rank that ends a run in which no training step completes in time.

Every rank runs one `Watchdog` thread. The training loop tells it where it is (`progress` after each step,
`phase` around start-up, checkpoint saves and validation), which sets a deadline: the first step, saves and
validation get `parallel.distributed_timeout_minutes`, every later step `parallel.train_timeout_seconds`.

A stuck collective blocks the main thread, so the ranks talk over a side channel: each thread publishes a
heartbeat (a counter, the last completed step, whether the main thread waits in a collective, its host and pid)
every tick to the torch.distributed rendezvous store (the TCPStore at MASTER_ADDR:MASTER_PORT, hosted by
torchrun's agent or by rank 0 under srun), through a client of its own with a short timeout. Starting the
watchdog needs no collective, so a peer stuck anywhere after it started is caught. A hang before that
(process-group creation, the resume plan's broadcast) ends by the process groups' own timeout,
`parallel.distributed_timeout_minutes`, without this report. When a rank's deadline passes:

1. it writes the Python stacks of all its threads to `<run>/hang/rank_<N>.txt` (faulthandler) and torch's
   flight recorder (the last collectives of every group, NCCL or gloo) to `flight_recorder_rank_<N>.pkl`;
2. it reads every rank's heartbeat twice, a few ticks apart: a rank whose counter did not move stopped
   reporting (stopped, dead, or cut off from the store's host); with none such, a rank that is not waiting in
   a collective is the one stuck;
3. the first live rank to create `<run>/hang/reporter` (O_EXCL; ranks that cannot reach the store try last)
   prints one line naming those ranks, their hosts and last completed steps, writes `report.txt`, and sets
   `status.json` to "hung" with that line; it SIGKILLs silent ranks on its own host (a SIGSTOPped process
   ignores the launcher's SIGTERM, and torchrun waits 30 s before its SIGKILL);
4. every live rank exits with HANG_EXIT_CODE once the report exists, so the job ends within the timeout plus a
   few ticks. Checkpoints are untouched: a save cut short leaves only an iter_N.tmp, which resume ignores.

The thread also notices when it could not run for a while (its sleep overran: the process was stopped, or
starved): `take_stalls` hands these to the straggler report (stragglers.py), so a short stall is reported
while the run goes on.

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
# - sys._current_frames: the main thread's innermost frame, to tell a rank waiting in a collective from one
#   stuck in its own work (CPython, documented but marked for debugging use).

import faulthandler
import json
import os
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Iterator

import torch.distributed as dist

HANG_EXIT_CODE = 76  # not 1 (a crash), 2 (bad input) or 75 (saved on a signal, requeue); slurm/common.sh reads it
HANG_DIR = "hang"
REPORT = "report.txt"
STORE_TIMEOUT_S = 3.0  # one side-channel operation; a partitioned rank gives up on the store after this
STALL_MIN_S = 2.0  # a tick that overran by this much is a stall worth reporting
_COLLECTIVE_FILES = ("torch/distributed/", "megatron/core/distributed/", "megatron/core/pipeline_parallel/p2p")


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
        # the heartbeats; this start's keys are kept apart from a restarted job's on the same store by its id.
        self.hosts, self.pids = {self.rank: self.host}, {self.rank: os.getpid()}
        attempt = (os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID", ""),
                   os.environ.get("TORCHELASTIC_RESTART_COUNT") or os.environ.get("SLURM_RESTART_COUNT", "0"))
        self.prefix = f"posaug_watchdog/{attempt[0]}.{attempt[1]}/"
        self.store, self.store_problem = self._connect()
        self.step = 0
        self.phase_name, self.setting = "start-up", "parallel.distributed_timeout_minutes"
        self.timeout_s = startup_timeout_s
        self.deadline = time.monotonic() + startup_timeout_s
        self.beat = 0
        self.stalls: list[tuple[float, int]] = []  # (seconds, step during which it happened)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # a completed step is published at once, not at the next tick
        self.fired = False  # the deadline passed: the thread is writing the report and will end the process
        self._main = threading.main_thread().ident
        self._thread = threading.Thread(target=self._run, name="hang-watchdog", daemon=True)

    def _connect(self):
        if self.world == 1:
            return dist.HashStore(), None
        addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not addr or not port:
            return None, "no MASTER_ADDR/MASTER_PORT (not started by torchrun or srun)"
        try:
            return dist.TCPStore(addr, int(port), is_master=False, timeout=timedelta(seconds=STORE_TIMEOUT_S),
                                 wait_for_workers=False), None
        except (RuntimeError, OSError, ValueError) as error:
            return None, f"the rendezvous store at {addr}:{port} is unreachable ({str(error).splitlines()[0]})"

    # ---- main thread ----------------------------------------------------------------------------------
    def start(self) -> "Watchdog":
        """Publish the first heartbeat and start the thread (the start-up deadline runs from construction)."""
        self._publish()
        self._thread.start()
        return self

    def progress(self, step: int) -> None:
        """A training step completed: the next must complete within the train timeout."""
        with self._lock:
            self.step = step
            self.phase_name, self.setting = f"step {step + 1}", "parallel.train_timeout_seconds"
            self.timeout_s = self.train_timeout_s
            self.deadline = time.monotonic() + self.train_timeout_s
        self._wake.set()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A section allowed the long timeout (checkpoint save, validation); the train timeout runs again after."""
        with self._lock:
            previous = self.phase_name
            self.phase_name, self.setting = name, "parallel.distributed_timeout_minutes"
            self.timeout_s = self.startup_timeout_s
            self.deadline = time.monotonic() + self.startup_timeout_s
        try:
            yield
        finally:
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
    def _in_collective(self) -> bool:
        frame = sys._current_frames().get(self._main)
        return frame is not None and any(part in frame.f_code.co_filename.replace("\\", "/")
                                         for part in _COLLECTIVE_FILES)

    def _publish(self) -> None:
        if self.store is None:
            return
        self.beat += 1
        record = {"beat": self.beat, "step": self.step, "in_collective": self._in_collective(), "host": self.host,
                  "pid": os.getpid()}
        try:
            self.store.set(f"{self.prefix}{self.rank}", json.dumps(record))
            self.store_problem = None
        except (RuntimeError, OSError) as error:  # a lost link, or the store's host stopped
            self.store_problem = (f"the rendezvous store at {os.environ.get('MASTER_ADDR')}:"
                                  f"{os.environ.get('MASTER_PORT')} does not answer ({str(error).splitlines()[0]})")

    def _run(self) -> None:
        while True:
            before = time.monotonic()
            self._wake.wait(self.tick)
            self._wake.clear()
            if self._stop.is_set():
                return
            overrun = time.monotonic() - before - self.tick  # a stopped process overruns its sleep
            with self._lock:
                if overrun >= STALL_MIN_S:
                    self.stalls.append((overrun, self.step + 1))
                self.fired = time.monotonic() > self.deadline and not self._stop.is_set()
            self._publish()
            if self.fired:
                self._hang()
                return

    def _read(self) -> dict[int, dict] | None:
        """Every rank's last heartbeat ({} for a rank that never sent one), or None without the store."""
        if self.store is None or self.store_problem:
            return None
        found = {}
        try:
            for rank in range(self.world):
                key = f"{self.prefix}{rank}"
                if self.store.check([key]):
                    found[rank] = json.loads(self.store.get(key))
        except (RuntimeError, OSError, ValueError):
            return None
        for rank, record in found.items():
            self.hosts[rank], self.pids[rank] = record["host"], record["pid"]
        return found

    def _hang(self) -> None:
        """Stacks, flight recorder, the report (one rank), status.json, and the exit of this process."""
        with self._lock:
            step, phase, setting, timeout_s = self.step, self.phase_name, self.setting, self.timeout_s
        try:
            self.hang_dir.mkdir(parents=True, exist_ok=True)
            self._write_stacks(step, phase)
            self._write_flight_recorder()
            first = self._read()
            for _ in range(3):  # a few ticks, so a live rank's counter moves at least once
                time.sleep(self.tick)
                self._publish()
            second = self._read()
            line, named, stopped = self._describe(step, phase, setting, timeout_s, first, second)
            if second is None:  # without the store this rank knows least: let an informed rank report first
                time.sleep(3 * STORE_TIMEOUT_S)
            if self._elected():
                self._report(line, named, stopped)
            else:
                deadline = time.monotonic() + 6 * STORE_TIMEOUT_S + 10 * self.tick
                while not (self.hang_dir / REPORT).exists() and time.monotonic() < deadline:
                    time.sleep(self.tick)
        except BaseException as error:  # the exit below must happen whatever went wrong on the way
            print(f"warning: rank {self.rank}: the hang report failed: {type(error).__name__}: {error}",
                  file=sys.stderr, flush=True)
        finally:
            exit_now()

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

    def _host_of(self, rank: int) -> str:
        """From its heartbeat, else from the launch layout: torchrun and srun give each node consecutive ranks."""
        if rank in self.hosts:
            return self.hosts[rank]
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE") or 0)
        return self.host if per_node and rank // per_node == self.rank // per_node else "an unknown host"

    def _who(self, ranks: list[int], seen: dict[int, dict]) -> str:
        def one(rank: int) -> str:
            step = seen.get(rank, {}).get("step")
            return (f"rank {rank} on {self._host_of(rank)} (" + ("no heartbeat at all: stuck in start-up before its "
                    "watchdog started" if step is None else f"last completed step {step}") + ")")
        return ", ".join(one(r) for r in ranks)

    def _describe(self, step: int, phase: str, setting: str, timeout_s: float, first: dict | None,
                  second: dict | None) -> tuple[str, list[int], list[int]]:
        """The one-line report, the ranks it names, and those of them that stopped reporting."""
        head = f"hang: no progress for {timeout_s:g} s ({setting}) in {phase} after step {step}: "
        if second is None:
            agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
            suspect = [0] if self.rank != 0 and not agent_store else []
            store_host = self.hosts.get(0) or os.environ.get("MASTER_ADDR", "?")  # srun: rank 0's host
            where = "a lost link to it" if agent_store else f"rank 0 on {store_host} hosts it: it stopped, or " \
                                                            "this rank's link to it is lost"
            return (head + f"rank {self.rank} on {self.host} cannot reach the other ranks: {self.store_problem} "
                    f"({where}); stacks in {self.hang_dir}"), suspect, suspect
        first = first or {}
        stopped = [r for r in range(self.world) if r != self.rank
                   and (r not in second or second[r]["beat"] == first.get(r, {}).get("beat"))]
        named = stopped
        if stopped:
            who = f"{self._who(stopped, second)} stopped reporting"
        else:
            outside = [r for r in range(self.world) if r in second and not second[r]["in_collective"]]
            if outside and (len(outside) < self.world or self.world == 1):
                who = (f"{self._who(outside, second)} {'is' if len(outside) == 1 else 'are'} stuck outside any "
                       f"collective" + (" while the others wait in one" if self.world > 1 else ""))
                named = outside
            else:
                who = ("every rank still reports and waits in a collective (a lost link between them, or ranks "
                       "calling different collectives)")
        return head + f"{who}; stacks of the live ranks in {self.hang_dir}", named, stopped

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
            time.sleep(self.tick)  # the other live ranks' stacks, before anything can end them
        hosts = sorted({self._host_of(r) for r in named} - {"an unknown host"})
        write_status(self.run_dir, "hung", self.step, self.total_iters, error=line, hung_ranks=named,
                     hung_hosts=hosts, checkpoint_iteration=latest_iteration(self.run_dir) or 0)
        tmp = self.hang_dir / f"{REPORT}.tmp"
        tmp.write_text(f"{line}\nranks: {' '.join(map(str, named))}\nhosts: {' '.join(hosts)}\n")
        os.replace(tmp, self.hang_dir / REPORT)
        print(f"error: {line}", file=sys.stderr, flush=True)
        for rank in stopped:  # a stopped process ignores SIGTERM until continued; the job must end now
            if self.hosts.get(rank) == self.host and rank != self.rank:
                _kill_tree(self.pids[rank])


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                for c in (task / "children").read_text().split()]
    except OSError:
        return []


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and its children (Megatron's checkpoint-writer process would outlive it, holding the
    launcher's output pipes open)."""
    for victim in [*_children(pid), pid]:
        try:
            os.kill(victim, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def exit_now() -> None:
    """End this process with HANG_EXIT_CODE, its child processes first (os._exit runs no atexit handler that
    would stop them)."""
    sys.stdout.flush()
    sys.stderr.flush()
    for child in _children(os.getpid()):
        _kill_tree(child)
    os._exit(HANG_EXIT_CODE)


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
