"""The elastic workers' heartbeats to the driver (issue 29): who beats, to where, and when nothing beats.

The driver's side (launcher/worker_watch.py) is exercised for real in tests/cluster/test_network_faults_elastic.py
(a frozen worker and a host cut off, dropped after --peer-timeout-s).
"""
from __future__ import annotations

import doctest
import json
import socket

import hvdtrain.distributed.driver_heartbeat as driver_heartbeat
from hvdtrain.environment import process


def test_docstring_examples_are_true():
    for module in (driver_heartbeat, process):
        result = doctest.testmod(module)
        assert result.attempted and not result.failed, module.__name__


def test_no_beat_outside_an_elastic_job_of_hvdtrain_launch():
    elastic = {"HOROVOD_RANK": "0", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_HOSTNAME": "node1",
               "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", driver_heartbeat.WATCH_ENV: "5000:ab"}
    for env in ({}, {**elastic, driver_heartbeat.WATCH_ENV: ""}, {**elastic, "HOROVOD_HOSTNAME": ""},
                {k: v for k, v in elastic.items() if k != "HOROVOD_RANK"}):
        with driver_heartbeat.beating(45, env) as beat:
            assert beat is None
    with driver_heartbeat.beating(0, elastic) as beat:   # --peer-timeout-s 0: off
        assert beat is None


def test_a_worker_beats_its_slot_and_bound_to_the_driver_and_says_bye():
    driver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    driver.bind(("127.0.0.1", 0))
    driver.settimeout(10)
    env = {"HOROVOD_RANK": "3", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_HOSTNAME": "node2",
           "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", driver_heartbeat.WATCH_ENV: f"{driver.getsockname()[1]}:t0k"}
    try:
        with driver_heartbeat.beating(12, env) as beat:
            assert beat is not None
            first = json.loads(driver.recv(1024))
        last = json.loads(driver.recv(1024))
        while not last["bye"]:
            last = json.loads(driver.recv(1024))
    finally:
        driver.close()
    assert first == {"token": "t0k", "host": "node2", "slot": 1, "pid": first["pid"], "timeout_s": 12, "bye": False}
    assert last["bye"] and last["host"] == "node2"
