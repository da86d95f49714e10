"""Reading every rank's heartbeat is one store call whatever the world size, so a large job answers inside the
side channel's limit (heartbeats.STORE_TIMEOUT_S, 3 s): 64 simulated ranks on a real TCPStore whose every call is
counted and delayed by 30 ms (a store across a loaded data centre network), where two calls per rank took 3.8 s
and blamed the store. The keys are reserved first (Heartbeats.reserve), as the watchdog thread does before its
first read: torch's multi_get waits out the client's timeout on a key that does not exist. ~3 s."""

import json
import socket
import time

import pytest
import torch.distributed as dist

from pretrain.trainer.hang_diagnosis import StepCounters
from pretrain.trainer.heartbeats import STORE_TIMEOUT_S, Heartbeats

WORLD, LATENCY_S = 64, 0.03


class DelayedStore:
    """A real store reached over a slow link: every call waits LATENCY_S, then goes to the store."""

    def __init__(self, store):
        self.store, self.calls = store, 0

    def __getattr__(self, name):
        method = getattr(self.store, name)

        def delayed(*args, **kwargs):
            self.calls += 1
            time.sleep(LATENCY_S)
            return method(*args, **kwargs)
        return delayed


@pytest.fixture
def store(monkeypatch):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    return server


def publish(store, zero: Heartbeats, rank: int) -> None:
    """The record rank r's Heartbeats.publish writes, set through the store's host (64 more clients would only
    load the test)."""
    store.set(f"{zero.prefix}{rank}", json.dumps({"beat": 1, **StepCounters(step=rank).record(),
                                                  "host": f"node{rank // 8}"}))


def reader(store, present: range, reserved: bool = True) -> Heartbeats:
    """Rank 0's Heartbeats (a real client of the store) after the ranks in `present` published theirs, its keys
    reserved (as its watchdog thread does first) unless told, its store calls then counted and delayed."""
    zero = Heartbeats(0, WORLD, StepCounters(), {"host": "node0"})
    for rank in present:
        publish(store, zero, rank)
    if reserved:
        assert zero.reserve(), zero.problem
    zero.link.store = DelayedStore(zero.link.store)
    return zero


def test_64_ranks_heartbeats_are_read_in_one_store_call_inside_the_limit(store):
    zero = reader(store, range(WORLD))
    started = time.monotonic()
    found = zero.read()
    assert found is not None, zero.problem
    assert time.monotonic() - started < STORE_TIMEOUT_S
    assert zero.link.store.calls == 1
    assert sorted(found) == list(range(WORLD)) and found[63]["step"] == 63 and found[9]["host"] == "node1"


def test_a_rank_that_never_published_is_left_out_in_the_same_one_call(store):
    zero = reader(store, range(0, WORLD - 1))
    found = zero.read()
    assert found is not None and sorted(found) == list(range(WORLD - 1)), zero.problem
    assert zero.link.store.calls == 1
    assert json.dumps(found[5])  # records as published


def test_a_rank_that_publishes_after_the_reservation_is_read(store):
    zero = reader(store, range(0, WORLD - 1))
    publish(store, zero, WORLD - 1)
    found = zero.read()
    assert found is not None and found[WORLD - 1]["step"] == WORLD - 1, zero.problem


def test_a_read_before_the_reservation_reserves_first_and_does_not_wait_on_a_missing_key(store):
    zero = reader(store, range(0, WORLD - 1), reserved=False)
    found = zero.read()
    assert found is not None and sorted(found) == list(range(WORLD - 1)), zero.problem
    again = zero.link.store.calls
    assert zero.read() is not None and zero.link.store.calls == again + 1  # reserved once: one call from now on
