"""The elastic workers' heartbeats to the driver (issue 29): who beats, to where, and when nothing beats; and
what a sender without the job's key can do to either side: nothing (issue 36).

The driver's side (launcher/worker_watch.py) is exercised for real in tests/cluster/test_network_faults_elastic.py
(a frozen worker and a host cut off, dropped after --peer-timeout-s) and under attack in
tests/multirank/test_control_plane_attack.py.
"""
from __future__ import annotations

import doctest
import os
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

from support.waiting import wait_for

import hvdtrain.distributed.control_wire as wire
import hvdtrain.distributed.driver_heartbeat as driver_heartbeat
from hvdtrain.environment import process
from hvdtrain.launcher import elastic_driver
from hvdtrain.launcher.worker_watch import WorkerWatch

KEY = "k" * 64


def test_docstring_examples_are_true():
    for module in (driver_heartbeat, process, elastic_driver):
        result = doctest.testmod(module)
        assert result.attempted and not result.failed, module.__name__


def elastic_env(port: int | str = 5000, key: str = KEY) -> dict[str, str]:
    return {"HOROVOD_RANK": "3", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_HOSTNAME": "node2",
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", driver_heartbeat.WATCH_ENV: str(port),
            wire.CONTROL_KEY_ENV: key}


def test_no_beat_outside_an_elastic_job_of_hvdtrain_launch_nor_without_the_key():
    elastic = elastic_env()
    for env in ({}, {**elastic, driver_heartbeat.WATCH_ENV: ""}, {**elastic, driver_heartbeat.WATCH_ENV: "5000:tok"},
                {**elastic, "HOROVOD_HOSTNAME": ""}, {k: v for k, v in elastic.items() if k != "HOROVOD_RANK"},
                {k: v for k, v in elastic.items() if k != wire.CONTROL_KEY_ENV}):
        with driver_heartbeat.beating(45, env) as beat:
            assert beat is None
    with driver_heartbeat.beating(0, elastic) as beat:   # --peer-timeout-s 0: off
        assert beat is None


def test_a_worker_beats_its_slot_sealed_to_the_driver_and_says_bye_with_no_timeout_on_the_wire():
    driver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    driver.bind(("127.0.0.1", 0))
    driver.settimeout(10)
    inbox = wire.Inbox(KEY.encode(), wire.TO_DRIVER)
    try:
        with driver_heartbeat.beating(12, elastic_env(driver.getsockname()[1])) as beat:
            assert beat is not None
            first = inbox.open(driver.recv(1024))
        last = inbox.open(driver.recv(1024))
        while last.body != "bye":
            last = inbox.open(driver.recv(1024))
    finally:
        driver.close()
    assert first.body == "beat" and driver_heartbeat.parse_worker_id(first.sender) == ("node2", 1, os.getpid())
    assert first.sender.startswith(f"node2/1/{os.getpid()}.")   # and this process's nonce: a restart is new
    assert last.sender == first.sender and last.seq > first.seq
    assert inbox.total_rejected() == 0


def test_the_worker_exits_only_on_the_drivers_sealed_answer_naming_it(tmp_path):
    """A real worker process beating to a fake driver: forged, replayed, other workers' and garbage answers,
    even from the driver's own address, leave it running; the genuine answer ends it with DROPPED_EXIT."""
    driver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    driver.bind(("127.0.0.1", 0))
    driver.settimeout(10)
    script = ("import time\nfrom hvdtrain.distributed import driver_heartbeat\n"
              "with driver_heartbeat.beating(30):\n    time.sleep(60)\n")
    env = {**os.environ, **elastic_env(driver.getsockname()[1])}
    worker = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE, text=True)
    try:
        inbox = wire.Inbox(KEY.encode(), wire.TO_DRIVER)
        beat, where = driver.recvfrom(1024)
        me = inbox.open(beat).sender
        other = wire.Sender(KEY.encode(), wire.FROM_DRIVER, "driver").seal(driver_heartbeat.dropped_notice("node9/0/1"))
        attacks = [b"dropped", os.urandom(100), b"x" * 2000,
                   wire.seal(b"wrong", wire.FROM_DRIVER, "driver", 2 ** 62, driver_heartbeat.dropped_notice(me)),
                   wire.seal(KEY.encode(), wire.TO_DRIVER, "driver", 2 ** 62, driver_heartbeat.dropped_notice(me)),
                   other]
        stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)   # not the driver's address:port
        for data in attacks:
            driver.sendto(data, where)
            stranger.sendto(wire.Sender(KEY.encode(), wire.FROM_DRIVER, "driver").seal(
                driver_heartbeat.dropped_notice(me)), where)   # even sealed: the kernel drops it (connect)
        stranger.close()
        time.sleep(2.5)
        assert worker.poll() is None, worker.stderr.read()
        driver.sendto(wire.Sender(KEY.encode(), wire.FROM_DRIVER, "driver").seal(driver_heartbeat.dropped_notice(me)),
                      where)
        assert worker.wait(timeout=10) == driver_heartbeat.DROPPED_EXIT
        assert "dropped this worker" in worker.stderr.read()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        driver.close()


class FakeDriver:
    """What WorkerWatch asks of the adapter's view of Horovod's driver (horovod_runner.DriverView): a world of
    node2 (two slots), nothing blacklisted. (The view on the real driver: tests/unit/test_elastic_end_of_job.py.)"""

    def __init__(self) -> None:
        self.failed: list[tuple[str, int]] = []

    def has_rank_assignment(self, host: str, slot: int) -> bool:
        return host == "node2" and slot < 2

    def record_failure(self, host: str, slot: int) -> None:
        self.failed.append((host, slot))


def test_the_driver_keeps_its_own_timeout_and_believes_no_forged_or_replayed_beat():
    watch = WorkerWatch(KEY, 2.0, "127.0.0.1")
    watch.driver = FakeDriver()
    sender = wire.Sender(KEY.encode(), wire.TO_DRIVER, "node2/1/77")
    first = sender.seal("beat")
    watch.hear(first, None)
    assert set(watch.heard) == {("node2", 1)}
    heard_at = watch.heard[("node2", 1)].at
    time.sleep(0.05)
    forged = [first, b'{"token": "x", "host": "node2", "slot": 1, "pid": 77, "timeout_s": 1e9, "bye": false}',
              wire.seal(b"wrong", wire.TO_DRIVER, "node2/1/77", 2 ** 62, "beat"),
              wire.seal(b"wrong", wire.TO_DRIVER, "node2/1/77", 2 ** 62, "bye"),
              wire.Sender(KEY.encode(), wire.PEER, "node2/1/77").seal("bye")]
    for data in forged:
        watch.hear(data, None)
    assert watch.heard[("node2", 1)].at == heard_at   # neither refreshed nor excused
    watch.judge(heard_at + 1.9)
    assert watch.driver.failed == []
    watch.judge(heard_at + 2.0)   # the driver's 2 s, whatever any packet said
    time.sleep(0.2)
    assert watch.driver.failed == [("node2", 1)] and watch.inbox.total_rejected() == len(forged)
    watch.sock.close()


def test_the_port_travels_in_the_environment_and_the_key_only_as_a_secret():
    watch = WorkerWatch(KEY, 45, "127.0.0.1")
    try:
        assert watch.env() == {driver_heartbeat.WATCH_ENV: str(watch.sock.getsockname()[1])}
        assert watch.secrets() == {wire.CONTROL_KEY_ENV: KEY} and KEY not in str(watch.env())
        assert watch.sock.getsockname()[0] == "127.0.0.1"
    finally:
        watch.sock.close()
    args = SimpleNamespace(command=["python", "-m", "hvdtrain", "--peer-timeout-s=7"], nics={"lo"})
    made = elastic_driver.worker_watch(args, {wire.CONTROL_KEY_ENV: KEY})
    try:
        assert made.timeout_s == 7 and made.sock.getsockname()[0] == "127.0.0.1"
    finally:
        made.sock.close()
    assert elastic_driver.worker_watch(args, {}) is None


class RunningDriver(FakeDriver):
    """FakeDriver for a watch whose thread runs: it runs until the test says the job is finished."""

    def __init__(self) -> None:
        super().__init__()
        self.done = False

    def finished(self) -> bool:
        return self.done


def test_ending_below_min_np_the_driver_waits_for_each_beating_workers_last_commit():
    """The driver's save request over the sealed channel: a worker waiting for the world saves once and answers;
    one not waiting yet (still in a collective) is asked again each second, and the driver waits no longer than
    its bound for it. Requests naming another worker, or not sealed by the driver, save nothing."""
    watch, driver = WorkerWatch(KEY, 45, "127.0.0.1"), RunningDriver()
    watch.watch(driver)
    calls: list[str] = []
    waiting = [False]

    def save() -> bool:
        calls.append("save")
        return waiting[0]

    env = elastic_env(watch.sock.getsockname()[1])
    try:
        with driver_heartbeat.beating(45, env, on_save=save) as beat:
            wait_for(lambda: ("node2", 1) in watch.heard, 10, "the worker's first beat")
            me = beat.id
            stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            where = watch.heard[("node2", 1)].address
            for data in (wire.Sender(KEY.encode(), wire.FROM_DRIVER, "driver").seal(
                             driver_heartbeat.save_request("node9/0/1")),
                         wire.seal(b"wrong", wire.FROM_DRIVER, "driver", 2 ** 62, driver_heartbeat.save_request(me))):
                watch.sock.sendto(data, where)
            stranger.sendto(wire.Sender(KEY.encode(), wire.FROM_DRIVER, "driver").seal(
                driver_heartbeat.save_request(me)), where)   # sealed, but not from the driver's address:port
            stranger.close()
            time.sleep(1.5)
            assert calls == []
            started = time.monotonic()
            assert watch.ask_to_save(2.5) == ["node2[1]"]     # not waiting for the world: no answer
            assert time.monotonic() - started >= 2.5 and len(calls) >= 2
            waiting[0] = True
            assert watch.ask_to_save(10) == []                # waiting: it saves and answers
            asked = len(calls)
            assert watch.ask_to_save(10) == [] and len(calls) == asked   # answered once: not asked again
    finally:
        driver.done = True
        watch.join(timeout=5)
    assert not watch.is_alive()
