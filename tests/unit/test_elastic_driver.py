"""The below --min-np watch on a stand-in for Horovod's elastic driver (the real one: tests/cluster/test_elastic.py)."""
from __future__ import annotations

import logging
import socketserver
import threading
import time
from types import SimpleNamespace

from hvdtrain.distributed import horovod_runner
from hvdtrain.launcher import elastic_driver
from hvdtrain.launcher.elastic_driver import BelowMinNpWatch


class FakeHosts:
    def __init__(self, slots: dict[str, int]) -> None:
        self.slots = slots

    @property
    def available_hosts(self) -> set[str]:
        return set(self.slots)

    def count_available_slots(self) -> int:
        return sum(self.slots.values())


class FakeDriver:
    """The attributes the watch reads, as Horovod 0.28.1's ElasticDriver has them."""

    def __init__(self, slots: dict[str, int], min_np: int) -> None:
        self._host_manager = SimpleNamespace(current_hosts=FakeHosts(slots))
        self._host_assignments = {host: [] for host in slots}
        self._min_num_proc = min_np
        self._wait_hosts_cond = threading.Condition()
        self.stopped = False
        self.stopped_with: str | None = None

    @property
    def host_assignments(self) -> dict[str, list]:
        return self._host_assignments

    def finished(self) -> bool:
        return self.stopped

    def stop(self, error_message: str | None = None) -> None:
        self.stopped, self.stopped_with = True, error_message


def watch(driver: FakeDriver, wait_s: float, monkeypatch) -> BelowMinNpWatch:
    monkeypatch.setattr(elastic_driver, "POLL_S", 0.01)
    # Giving up quiets this process's logging and socketserver errors: undone after the test.
    monkeypatch.setattr(socketserver.BaseServer, "handle_error", socketserver.BaseServer.handle_error)
    found = BelowMinNpWatch(horovod_runner.DriverView(driver), wait_s)
    found.exit_later = lambda: None   # the real one ends the process after a grace period
    return found


def test_below_min_np_for_the_wait_stops_the_driver_naming_the_lost_hosts(monkeypatch, capsys):
    driver = FakeDriver({"node1": 2, "node2": 1, "node3": 1}, min_np=3)
    guard = watch(driver, 0.2, monkeypatch)
    guard.start()
    time.sleep(0.1)
    assert not driver.stopped          # all there
    driver._host_manager.current_hosts = FakeHosts({"node2": 1})
    started = time.monotonic()
    guard.join(timeout=5)
    assert 0.15 < time.monotonic() - started < 2
    line = capsys.readouterr().err.strip()
    assert line == driver.stopped_with == guard.gave_up
    assert line.startswith("hvdtrain: error: fewer than --min-np 3 slots for 0.2 s: lost host(s) node1, node3;")
    logging.disable(logging.NOTSET)


def test_hosts_back_within_the_wait_reset_the_clock(monkeypatch):
    driver = FakeDriver({"node1": 1, "node2": 1}, min_np=2)
    guard = watch(driver, 0.3, monkeypatch)
    guard.start()
    for _ in range(3):   # below for 0.15 s at a time, then back
        driver._host_manager.current_hosts = FakeHosts({"node1": 1})
        time.sleep(0.15)
        driver._host_manager.current_hosts = FakeHosts({"node1": 1, "node2": 1})
        time.sleep(0.1)
    assert not driver.stopped and guard.gave_up is None
    driver.stop()
    guard.join(timeout=5)
    assert not guard.is_alive()


def test_nothing_is_watched_before_the_job_first_starts(monkeypatch):
    driver = FakeDriver({}, min_np=2)   # the initial wait for slots is --start-timeout's business
    driver._host_assignments = {}
    guard = watch(driver, 0.05, monkeypatch)
    guard.start()
    time.sleep(0.2)
    assert guard.gave_up is None
    driver.stop()
    guard.join(timeout=5)
    assert not guard.is_alive()
