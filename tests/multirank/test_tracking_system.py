"""System metrics in the MLflow run: rank 0 (its host's local rank 0) samples CPU and memory in a background
thread into the same run, named by host; rank 1 on the same host samples nothing. (Issue 27.)

The two-worker job's check (rank 0 alone samples, into the one run) is in test_tracking_multirank.py, where the
job that checks the run's records serves it too: one horovodrun launch less."""
from __future__ import annotations

import time

from hvdtrain.tracking import system


def test_a_sampler_without_a_tracker_keeps_its_samples_for_the_trainer_to_gather():
    sampler = system.SystemSampler(0.05, host="node-b")
    try:
        deadline = time.monotonic() + 10
        while not sampler.pending and time.monotonic() < deadline:
            time.sleep(0.05)
        taken = sampler.drain()
    finally:
        sampler.stop()
    assert taken and {name for name, *_ in taken} >= {"system/node-b/cpu_percent", "system/node-b/memory_percent"}
    assert all(step >= 0 and stamp > 0 for _, _, step, stamp in taken)
    assert system.start(env={system.INTERVAL_ENV: "0"}) is None
