"""The below --min-np watch on Horovod's real ElasticDriver (built by the adapter as `hvdtrain launch` builds it,
with its real rendezvous server and host discovery; the workers are the driver's create_worker_fn threads). Hosts
leave and come back through discovery, as a user's discovery script would make them. The whole launcher:
tests/cluster/test_elastic.py."""
from __future__ import annotations

import logging
import socketserver
import time
from collections.abc import Iterator

import pytest

from hvdtrain.distributed import horovod_rendezvous, horovod_runner
from hvdtrain.launcher import elastic_driver
from hvdtrain.launcher.elastic_driver import BelowMinNpWatch

DISCOVERY_S = 1.0   # Horovod 0.28.1 asks the discovery for hosts once a second


class Cluster:
    def __init__(self, slots: dict[str, int], min_np: int) -> None:
        self.slots = dict(slots)
        self.driver, _server, _port = horovod_rendezvous.elastic_driver(lambda: dict(self.slots), min_np, 4, timeout=30,
                                                                    cooldown_range=(600, 600), key=b"k" * 64,
                                                                    host="127.0.0.1")

    def start(self, np: int) -> None:
        def worker(_slot_info, events) -> tuple[int, float]:
            while not any(event.is_set() for event in events):
                time.sleep(0.05)
            return 0, time.time()

        self.driver.start(np, worker)

    def watch(self, wait_s: float) -> BelowMinNpWatch:
        found = BelowMinNpWatch(horovod_runner.DriverView(self.driver), wait_s)
        found.exit_later = lambda: None   # the real one ends the process after a grace period
        found.start()
        return found


@pytest.fixture
def cluster(monkeypatch) -> Iterator[type[Cluster]]:
    monkeypatch.setattr(elastic_driver, "POLL_S", 0.05)
    # Giving up quiets this process's logging and socketserver errors: undone after the test.
    monkeypatch.setattr(socketserver.BaseServer, "handle_error", socketserver.BaseServer.handle_error)
    made: list[Cluster] = []

    def make(slots: dict[str, int], min_np: int) -> Cluster:
        made.append(Cluster(slots, min_np))
        return made[-1]

    yield make   # type: ignore[misc]
    logging.disable(logging.NOTSET)
    for each in made:
        if not each.driver.finished():
            each.driver.stop()


def test_below_min_np_for_the_wait_stops_the_driver_naming_the_lost_hosts(cluster, capsys):
    job = cluster({"node1": 2, "node2": 1, "node3": 1}, min_np=3)
    job.start(4)
    guard = job.watch(0.5)
    time.sleep(DISCOVERY_S * 1.5)
    assert not job.driver.finished() and guard.gave_up is None   # all there
    job.slots = {"node2": 1}
    started = time.monotonic()
    guard.join(timeout=15)
    assert not guard.is_alive() and job.driver.finished()
    assert 0.5 <= time.monotonic() - started < 3 * DISCOVERY_S + 0.5
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == guard.gave_up
    assert line.startswith("hvdtrain: error: fewer than --min-np 3 slots for 0.5 s: lost host(s) node1, node3; "
                           "1 slot(s) left;"), line


def test_hosts_back_within_the_wait_reset_the_clock(cluster):
    job = cluster({"node1": 1, "node2": 1}, min_np=2)
    job.start(2)
    guard = job.watch(2.5 * DISCOVERY_S)
    for _ in range(3):   # below for 1-2 s at a time (discovery's pace), 3 s or more in all, then back
        job.slots = {"node1": 1}
        time.sleep(DISCOVERY_S)
        job.slots = {"node1": 1, "node2": 1}
        time.sleep(1.5 * DISCOVERY_S)
    assert not job.driver.finished() and guard.gave_up is None
    job.driver.stop()
    guard.join(timeout=5)
    assert not guard.is_alive()


def test_nothing_is_watched_before_the_job_first_starts(cluster):
    job = cluster({"node1": 1}, min_np=2)   # the initial wait for slots is --start-timeout's business
    guard = job.watch(0.05)
    time.sleep(DISCOVERY_S * 1.5)
    assert guard.gave_up is None and not job.driver.finished()
    job.driver.stop()
    guard.join(timeout=5)
    assert not guard.is_alive()
