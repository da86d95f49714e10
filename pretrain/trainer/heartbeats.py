"""The hang watchdog's side channel: each rank's heartbeat in the torch.distributed rendezvous store.

A heartbeat is a counter that moves every tick, the rank's progress counters (hang_diagnosis.StepCounters) and its
identity (host, pid, process start time). The store is the TCPStore at MASTER_ADDR:MASTER_PORT, hosted by
torchrun's agent or by rank 0 under srun, reached through a client of this rank's own.

Every store operation runs on a helper thread and is given up after STORE_TIMEOUT_S: torch's TCPStore client does
not keep its own timeout once the store's host is SIGSTOPped (torch 2.13, measured: a `get` with a 3 s timeout
still blocked after 15 s, and held the client's lock, so the next `set` blocked too). A call still blocked makes
the next one fail at once, so a rank cut off from the store reports within the train timeout plus a few ticks.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import timedelta
from typing import Any, Callable

import torch.distributed as dist

from pretrain.trainer.hang_diagnosis import StepCounters

STORE_TIMEOUT_S = 3.0  # one side-channel operation; a partitioned rank gives up on the store after this


class StoreUnanswered(Exception):
    """The store did not answer in time, or an earlier call to it is still blocked."""


class StoreLink:
    """A store client whose every operation returns or fails within `timeout_s`."""

    def __init__(self, store: Any, timeout_s: float) -> None:
        self.store, self.timeout_s = store, timeout_s
        self._idle = threading.Lock()  # held while a call runs; a call that never returns keeps it

    def call(self, operation: Callable[[Any], Any]) -> Any:
        """`operation(store)`, or StoreUnanswered; a store error is raised as it is."""
        if not self._idle.acquire(blocking=False):
            raise StoreUnanswered("an earlier call to it is still blocked")
        outcome: list = []
        done = threading.Event()

        def run() -> None:
            try:
                outcome.append((True, operation(self.store)))
            except BaseException as error:  # handed to the caller
                outcome.append((False, error))
            finally:
                self._idle.release()
                done.set()

        threading.Thread(target=run, name="hang-watchdog-store", daemon=True).start()
        if not done.wait(self.timeout_s):
            raise StoreUnanswered(f"no answer in {self.timeout_s:g} s")
        ok, value = outcome[0]
        if not ok:
            raise value
        return value


def fetch_records(store: Any, keys: dict[int, str]) -> dict[int, dict]:
    """{rank: heartbeat} of the keys present, in two store round trips whatever the world size (a `check` of
    every key, then one `multi_get`), not two per rank: 64 ranks at 30 ms a call would outlast STORE_TIMEOUT_S.
    Only when some rank never published (it never started its watchdog) are the keys checked one by one."""
    names = list(keys.values())
    if not names:
        return {}
    present = keys if store.check(names) else {rank: key for rank, key in keys.items() if store.check([key])}
    if not present:
        return {}
    if hasattr(store, "multi_get"):  # torch >= 2.5
        values = store.multi_get(list(present.values()))
    else:
        values = [store.get(key) for key in present.values()]
    return {rank: json.loads(value) for rank, value in zip(present, values)}


class Heartbeats:
    """This rank's heartbeat, published every tick, and every rank's, read when a deadline passed."""

    def __init__(self, rank: int, world: int, counters: StepCounters, identity: dict) -> None:
        self.rank, self.world, self.counters, self.identity = rank, world, counters, identity
        # a restarted job's keys on the same store are kept apart by its attempt
        attempt = (os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID", ""),
                   os.environ.get("TORCHELASTIC_RESTART_COUNT") or os.environ.get("SLURM_RESTART_COUNT", "0"))
        self.prefix = f"posaug_watchdog/{attempt[0]}.{attempt[1]}/"
        self.link, self.problem = self._connect()
        self.beat = 0
        self.records: dict[int, dict] = {}  # every rank's last heartbeat seen

    def _connect(self) -> tuple[StoreLink | None, str | None]:
        if self.world == 1:
            return StoreLink(dist.HashStore(), STORE_TIMEOUT_S), None
        addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not addr or not port:
            return None, "no MASTER_ADDR/MASTER_PORT (not started by torchrun or srun)"
        try:
            store = dist.TCPStore(addr, int(port), is_master=False, timeout=timedelta(seconds=STORE_TIMEOUT_S),
                                  wait_for_workers=False)
        except (RuntimeError, OSError, ValueError) as error:
            return None, f"the rendezvous store at {addr}:{port} is unreachable ({str(error).splitlines()[0]})"
        return StoreLink(store, STORE_TIMEOUT_S), None

    def publish(self) -> None:
        """This rank's heartbeat, with its counters as they are now."""
        if self.link is None:
            return
        self.beat += 1
        record = json.dumps({"beat": self.beat, **self.counters.record(), **self.identity})
        try:
            self.link.call(lambda store: store.set(f"{self.prefix}{self.rank}", record))
            self.problem = None
        except (StoreUnanswered, RuntimeError, OSError) as error:  # a lost link, or the store's host stopped
            self.problem = f"the rendezvous store does not answer ({str(error).splitlines()[0]})"

    def read(self, ranks: range | list[int] | None = None) -> dict[int, dict] | None:
        """The last heartbeat of each rank that sent one, or None when the store does not answer."""
        if self.link is None or self.problem:
            return None
        keys = {rank: f"{self.prefix}{rank}" for rank in (range(self.world) if ranks is None else ranks)}
        try:
            found = self.link.call(lambda store: fetch_records(store, keys))
        except (StoreUnanswered, RuntimeError, OSError, ValueError) as error:
            self.problem = f"the rendezvous store does not answer ({str(error).splitlines()[0]})"
            return None
        self.records.update(found)
        return found
