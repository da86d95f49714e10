"""The hang watchdog's side channel: each rank's heartbeat in the torch.distributed rendezvous store.

A heartbeat is a counter that moves every tick, the rank's progress counters (hang_diagnosis.StepCounters) and its
identity (host, pid, process start time). The store is the TCPStore at MASTER_ADDR:MASTER_PORT, hosted by
torchrun's agent or by rank 0 under srun, reached through a client of this rank's own.

Every store operation runs on a helper thread and is given up after STORE_TIMEOUT_S: torch's TCPStore client does
not keep its own timeout once the store's host is SIGSTOPped (torch 2.13, measured: a `get` with a 3 s timeout
still blocked after 15 s, and held the client's lock, so the next `set` blocked too). A call still blocked makes
the next one fail at once, so a rank cut off from the store reports within the train timeout plus a few ticks.

A read is one store call, a `multi_get` of every rank's key, whatever the world size (it was a `check`, then a
`multi_get`). On the wire torch's TCPStore client sends a WAIT for the keys before the MULTI_GET, so a read is two
request/reply exchanges, not three (torch 2.13, counted through a forwarding TCP proxy); no client call reads many
values in one exchange. That WAIT lasts up to the client's timeout for a key that does not exist, so every key is
made to exist first (`Heartbeats.reserve`, on the watchdog thread before its first read): `compare_set(key, "", "")`
creates an empty value where no rank published and leaves a published heartbeat alone (rank r's own `set` always
overwrites it). An empty value reads as "never published". The reservation costs, once per process, a `check` per
STORE_BATCH keys and, where some of them are missing, a `compare_set` per key; a read of a key not yet reserved
reserves it first, so no read ever waits on a missing key.
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
STORE_BATCH = 16  # keys reserved per bounded call: 16 compare_sets at 30 ms a call fit STORE_TIMEOUT_S


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
    """{rank: heartbeat} of the ranks that published one, in one store call whatever the world size (a `multi_get`;
    one `get` per rank before torch 2.5). Every key must exist (reserved), or the call waits out the timeout."""
    if not keys:
        return {}
    if hasattr(store, "multi_get"):  # torch >= 2.5
        values = store.multi_get(list(keys.values()))
    else:
        values = [store.get(key) for key in keys.values()]
    return {rank: json.loads(value) for rank, value in zip(keys, values) if value}


def reserve_keys(store: Any, keys: list[str]) -> None:
    """Make each key exist, as an empty value where none was set; a value already set is left as it is."""
    if store.check(keys):
        return
    for key in keys:
        store.compare_set(key, "", "")


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
        self.reserved: set[int] = set()  # ranks whose key is known to exist (a multi_get of them cannot wait)

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

    def reserve(self, ranks: range | list[int] | None = None) -> bool:
        """Make the heartbeat key of every rank (or of `ranks`) exist, so a read never waits on a missing one;
        False, with `problem` set, when the store does not answer."""
        if self.link is None:
            return False
        missing = [rank for rank in (range(self.world) if ranks is None else ranks) if rank not in self.reserved]
        if not missing:
            return True
        # one bounded call per STORE_BATCH keys: 128 ranks' compare_sets at 30 ms a call (3.8 s) in one would
        # outlast STORE_TIMEOUT_S and blame the store
        for start in range(0, len(missing), STORE_BATCH):
            batch = missing[start:start + STORE_BATCH]
            keys = [f"{self.prefix}{rank}" for rank in batch]
            try:
                self.link.call(lambda store: reserve_keys(store, keys))
            except (StoreUnanswered, RuntimeError, OSError, ValueError) as error:
                self.problem = f"the rendezvous store does not answer ({str(error).splitlines()[0]})"
                return False
            self.reserved.update(batch)
        return True

    def read(self, ranks: range | list[int] | None = None) -> dict[int, dict] | None:
        """The last heartbeat of each rank that sent one, or None when the store does not answer."""
        if self.link is None or self.problem:
            return None
        wanted = range(self.world) if ranks is None else ranks
        if not self.reserve(wanted):  # nothing to do once the watchdog thread reserved them all
            return None
        keys = {rank: f"{self.prefix}{rank}" for rank in wanted}
        try:
            found = self.link.call(lambda store: fetch_records(store, keys))
        except (StoreUnanswered, RuntimeError, OSError, ValueError) as error:
            self.problem = f"the rendezvous store does not answer ({str(error).splitlines()[0]})"
            return None
        self.records.update(found)
        return found
