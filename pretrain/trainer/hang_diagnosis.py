"""What a hang report says: from every rank's progress counters in two looks at the heartbeats, who is stuck.

The counters are where each rank's main thread last was: its last completed step, the phase it entered since
(each entry counted, so phases order themselves as the loop runs them) and the microbatch of the step's
forward-backward. They are plain attribute writes by the loop and the engine; the watchdog thread publishes them.
No stack frame is read: with NCCL a collective returns at once and a rank waiting for a peer blocks at the next
host sync (`loss.item()`), so "waiting in a collective" cannot be read from where its Python code is. Where it
got to can, and that is the same on NCCL as on gloo:

- a rank whose heartbeat counter did not move between the looks stopped reporting (stopped, dead, or cut off
  from the store's host): those are named;
- else the live ranks behind the others, at the lowest (step, phase entry, microbatch), are named: the others
  wait for them at the first collective that needs them;
- if every rank's host is at the same point, the ranks whose GPU has not finished the work queued before it (a
  CUDA event recorded when each phase ends, still pending: device_progress) are named; without CUDA events, or
  with every GPU done (or every GPU pending), the report says that every rank waits there, and names the point;
- a rank that cannot read the heartbeats at all (the store does not answer) names the store's host: rank 0
  under srun (the rendezvous address MASTER_ADDR), torchrun's agent under torchrun.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from pretrain.trainer.device_progress import DeviceProgress


class StepCounters:
    """Where this rank's main thread is: written by the loop and the engine, read by the watchdog thread."""

    def __init__(self, step: int = 0, device: DeviceProgress | None = None) -> None:
        self.step = step  # last completed step
        self.phase = "start-up"
        self.entered = 0  # phases entered since the last completed step: the order of the loop's phases
        self.microbatch = 0  # forward passes started in this step's forward-backward
        self.device = device or DeviceProgress()  # the GPU's side of the same phases (nothing on CPU)

    def enter(self, phase: str) -> None:
        """The main thread starts a phase (forward-backward, gradient sync, optimizer, validation, save, ...)."""
        ended = "the work between steps" if self.phase == "after the step" else self.phase
        self.device.mark(f"{ended} of step {self.step + 1}")  # after the last kernel of the phase that ends
        self.microbatch = 0
        self.phase = phase
        self.entered += 1

    def completed(self, step: int) -> None:
        """A training step completed."""
        self.device.mark(f"{self.phase} of step {step}")
        self.step, self.phase, self.entered, self.microbatch = step, "after the step", 0, 0

    def record(self) -> dict:
        """The counters as a heartbeat carries them."""
        return {"step": self.step, "phase": self.phase, "entered": self.entered, "microbatch": self.microbatch,
                **self.device.record()}


def point(record: dict) -> tuple[int, int, int]:
    """A heartbeat's place in the run, comparable across ranks: (step, phase entry, microbatch)."""
    return record.get("step", 0), record.get("entered", 0), record.get("microbatch", 0)


def where(record: dict) -> str:
    """A heartbeat's place in words."""
    text = f"last completed step {record['step']}, in {record.get('phase', '?')}"
    if record.get("phase") in ("forward-backward", "validation"):
        text += f" at microbatch {record.get('microbatch', 0)}"
    return text


@dataclass
class Observer:
    """The rank that writes the diagnosis, and what it knows of the others without reading their heartbeats."""

    rank: int
    world: int
    host: str
    hang_dir: Path
    hosts: dict[int, str] = field(default_factory=dict)  # from heartbeats seen so far
    store_problem: str | None = None  # why this rank could not reach the rendezvous store, if it could not
    store_address: str = "?"  # MASTER_ADDR:MASTER_PORT
    agent_store: bool = False  # torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE), not rank 0
    per_node: int = 0  # LOCAL_WORLD_SIZE: ranks per host, consecutive under torchrun and srun

    def host_of(self, rank: int) -> str:
        """From its heartbeat, else from the launch layout."""
        if rank in self.hosts:
            return self.hosts[rank]
        same = self.per_node and rank // self.per_node == self.rank // self.per_node
        return self.host if same else "an unknown host"


class Verdict(NamedTuple):
    line: str  # the one-line report
    named: list[int]  # the ranks it blames
    stopped: list[int]  # those of them that stopped reporting (candidates for a kill on their host)


def diagnose(observer: Observer, step: int, phase: str, setting: str, timeout_s: float, first: dict | None,
             second: dict | None) -> Verdict:
    """The report of a hang from two looks at every rank's heartbeat (None: the store did not answer)."""
    head = f"hang: no progress for {timeout_s:g} s ({setting}) in {phase} after step {step}: "
    if second is None:
        return _cut_off(observer, head)
    first = first or {}
    stopped = [r for r in range(observer.world) if r != observer.rank
               and (r not in second or second[r]["beat"] == first.get(r, {}).get("beat"))]
    tail = f"; stacks of the live ranks in {observer.hang_dir}"
    if stopped:
        return Verdict(head + f"{_who(observer, stopped, second)} stopped reporting" + tail, stopped, stopped)
    lowest = min(point(second[r]) for r in second)
    behind = sorted(r for r in second if point(second[r]) == lowest)
    if observer.world == 1:
        who = f"{_who(observer, behind, second)} is stuck"
    elif len(behind) < observer.world:
        verb = "is" if len(behind) == 1 else "are"
        them = "it" if len(behind) == 1 else "them"
        who = f"{_who(observer, behind, second)} {verb} behind the others, which wait for {them}"
    elif 0 < len(late := sorted(r for r in second if second[r].get("gpu_pending"))) < observer.world:
        pending = "; ".join(f"rank {r}: {second[r]['gpu_pending']}" for r in late)
        who = (f"{_who(observer, late, second)}: its GPU has not finished the work queued before ({pending}) while "
               "the other ranks' GPUs have; every host waits at the same place for it")
        behind = late
    else:
        who = (f"every rank still reports and waits at the same place ({where(second[behind[0]])}): a lost link "
               "between them, or ranks calling different collectives")
        behind = []
    return Verdict(head + who + tail, behind, [])


def _cut_off(observer: Observer, head: str) -> Verdict:
    if observer.agent_store:
        suspect, where_ = [], "hosted by torchrun's agent: a lost link to it"
    else:  # srun (static env:// rendezvous): rank 0 hosts the store at MASTER_ADDR
        suspect = [0] if observer.rank != 0 else []
        host = observer.hosts.get(0) or observer.store_address.rsplit(":", 1)[0]
        where_ = f"hosted by rank 0 on {host}: rank 0 stopped, or this rank's link to it is lost"
    return Verdict(head + f"rank {observer.rank} on {observer.host} cannot reach the other ranks: "
                   f"{observer.store_problem} (the store at {observer.store_address} is {where_}); stacks in "
                   f"{observer.hang_dir}", suspect, suspect)


def _who(observer: Observer, ranks: list[int], seen: dict[int, dict]) -> str:
    def one(rank: int) -> str:
        record = seen.get(rank)
        state = ("no heartbeat at all: stuck in start-up before its watchdog started" if record is None
                 else where(record))
        return f"rank {rank} on {observer.host_of(rank)} ({state})"
    return ", ".join(one(r) for r in ranks)
