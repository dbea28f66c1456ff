"""WorkerWatch (launcher/worker_watch.py) against Horovod's real ElasticDriver: built by the adapter as `hvdtrain
launch` builds it, its real rendezvous server, host manager and worker registry; the workers are the driver's
own create_worker_fn threads (as in horovod/ray/elastic_v2.py) and their beats real sealed datagrams on loopback.

Nothing of Horovod is faked: if Horovod's driver stops taking a recorded failure the way 0.28.1 does (blacklist
the host, re-form the world from the others), these tests fail."""
from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from support.waiting import wait_for

from hvdtrain.distributed import control_wire, horovod_rendezvous, horovod_runner
from hvdtrain.distributed.control_wire import FROM_DRIVER, MAX_DATAGRAM, TO_DRIVER
from hvdtrain.distributed.driver_heartbeat import BEAT, BYE, DRIVER_SENDER, dropped_notice, worker_id
from hvdtrain.launcher import worker_watch
from hvdtrain.launcher.worker_watch import WorkerWatch

HOSTS = {"hostA": 1, "hostB": 1}
SILENCE_S = 1.0


@dataclass
class Job:
    driver: object
    watch: WorkerWatch
    key: str
    ended: dict[str, int] = field(default_factory=dict)   # host -> exit code its worker thread returned
    sock: socket.socket = field(default_factory=lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))

    def beat(self, host: str, body: str = BEAT, key: str | None = None, pid: int = 4242, nonce: str = "a1") -> None:
        sender = control_wire.Sender((key or self.key).encode(), TO_DRIVER, worker_id(host, 0, pid, nonce))
        self.sock.sendto(sender.seal(body), ("127.0.0.1", self.watch.sock.getsockname()[1]))


@pytest.fixture
def job(monkeypatch) -> Iterator[Job]:
    monkeypatch.setattr(worker_watch, "POLL_S", 0.1)
    key = control_wire.new_key()
    driver, _server, _port = horovod_rendezvous.elastic_driver(lambda: dict(HOSTS), 1, 2, timeout=30,
                                                           cooldown_range=(600, 600), key=key.encode(),
                                                           host="127.0.0.1")
    found = Job(driver, WorkerWatch(key, SILENCE_S, address="127.0.0.1"), key)

    def worker(slot_info, events) -> tuple[int, float]:
        # A worker runs until the job ends (shutdown) or Horovod terminates its host (blacklist): the events
        # Horovod hands every worker it starts.
        while not any(event.is_set() for event in events):
            time.sleep(0.05)
        found.ended[slot_info.hostname] = 0 if events[0].is_set() else 1
        return found.ended[slot_info.hostname], time.time()

    driver.start(2, worker)
    assert driver.world_size() == 2 and driver.has_rank_assignment("hostB", 0)
    found.watch.watch(driver)
    yield found
    driver.stop()
    found.watch.join(timeout=10)
    found.sock.close()
    assert not found.watch.is_alive()


def keep_beating(job: Job, host: str, stop: threading.Event, **kwargs) -> threading.Thread:
    def loop() -> None:
        while not stop.is_set():
            job.beat(host, **kwargs)
            time.sleep(0.1)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def test_a_silent_worker_is_dropped_its_host_blacklisted_and_the_world_reformed_without_it(job, capsys):
    stop = threading.Event()
    survivor = keep_beating(job, "hostA", stop)
    try:
        job.beat("hostB")
        time.sleep(SILENCE_S / 2)
        assert job.driver.has_rank_assignment("hostB", 0) and not job.watch.lines   # not silent long enough yet
        wait_for(lambda: job.watch.lines, 20, what="the drop of hostB")
        # Horovod's registry waits for the survivors to report for the next rendezvous, as a real one's would.
        job.driver.record_ready("hostA", 0)
        wait_for(lambda: not job.driver.has_rank_assignment("hostB", 0), 20, what="the world without hostB")
    finally:
        stop.set()
        survivor.join()
    assert job.driver.has_rank_assignment("hostA", 0) and job.driver.world_size() == 1
    assert not job.driver.finished()
    wait_for(lambda: "hostB" in job.ended, 20, what="Horovod to end hostB's worker")
    assert job.ended == {"hostB": 1}
    slots, hosts = horovod_runner.DriverView(job.driver).available()
    assert (slots, hosts) == (1, ["hostA"])
    assert [line.split(" (slot")[0] for line in job.watch.lines] == [
        "hvdtrain: warning: the worker on host hostB"]
    assert "--peer-timeout-s 1" in job.watch.lines[0] and job.watch.lines[0] in capsys.readouterr().err


def test_beats_under_another_key_do_not_keep_a_silent_worker(job):
    stop = threading.Event()
    forged = keep_beating(job, "hostB", stop, key=control_wire.new_key())
    survivor = keep_beating(job, "hostA", stop)
    try:
        job.beat("hostB")   # heard once, with the job's key
        wait_for(lambda: job.watch.lines, 20, what="the drop of hostB despite the forged beats")
    finally:
        stop.set()
        forged.join()
        survivor.join()
    assert "host hostB" in job.watch.lines[0] and len(job.watch.lines) == 1
    assert sum(job.watch.inbox.rejected.values()) > 0


def test_a_dropped_worker_that_speaks_again_is_told_so_sealed_and_by_name(job):
    job.beat("hostB", pid=7)
    wait_for(lambda: job.watch.lines, 20, what="the drop of hostB")
    job.driver.record_ready("hostA", 0)
    job.beat("hostB", pid=7)
    job.sock.settimeout(10)
    data, sender = job.sock.recvfrom(MAX_DATAGRAM + 1)
    assert sender == ("127.0.0.1", job.watch.sock.getsockname()[1])
    answer = control_wire.Inbox(job.key.encode(), FROM_DRIVER, {DRIVER_SENDER}, "test").open(data)
    assert answer is not None and answer.body == dropped_notice(worker_id("hostB", 0, 7, "a1"))


def test_a_restarted_worker_with_the_dropped_ones_host_slot_and_pid_is_a_new_worker(job):
    """Issue 51: dropped ids were host/slot/pid, never forgotten; a container restarted on the same host name often
    gets the same pid, so its first beat was answered "dropped" and the host could never rejoin."""
    job.beat("hostB", pid=7, nonce="a1")
    wait_for(lambda: job.watch.lines, 20, what="the drop of hostB")
    job.driver.record_ready("hostA", 0)
    job.sock.settimeout(2)
    job.beat("hostB", pid=7, nonce="b2")    # the same pid, a new process
    with pytest.raises(socket.timeout):
        job.sock.recvfrom(MAX_DATAGRAM + 1)  # no "dropped" answer
    assert job.watch.dropped == {worker_id("hostB", 0, 7, "a1")}


def test_a_worker_that_said_goodbye_is_not_dropped_for_its_silence(job):
    job.beat("hostB")
    job.beat("hostB", body=BYE)
    time.sleep(SILENCE_S * 3)
    assert not job.watch.lines and job.driver.has_rank_assignment("hostB", 0)
    assert os.environ.get("HVDTRAIN_WORKER_WATCH") is None   # env() is handed out, never set in this process
