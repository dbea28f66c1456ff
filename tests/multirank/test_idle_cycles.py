"""Tier 3: hvdtrain's idle-cycle patch (scripts/horovod/patches, 0008), 2 real workers under Gloo: collectives (late
peer, async, grouped, uneven work + join) stay right with HOROVOD_IDLE_CYCLE_TIME, and idle ranks stop burning
CPU on empty negotiation rounds."""
from __future__ import annotations

import re

import pytest
from support.processes import horovod_patched, horovodrun, show


@pytest.mark.skipif(not horovod_patched("HOROVOD_IDLE_CYCLE_TIME"),
                    reason="this Horovod lacks hvdtrain's idle-cycle patch: re-run make setup")
def test_idle_ranks_wait_for_work_and_collectives_stay_right():
    cpu = {}
    for idle in ("50", "0"):
        proc = horovodrun(2, ["tests/ranks/idle_cycles.py"], "gloo",
                          env={"HOROVOD_IDLE_CYCLE_TIME": idle, "HOROVOD_CYCLE_TIME": "2"})
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0 and out.count("idle cycles OK") == 2, show(proc)
        cpu[idle] = [int(ms) for ms in re.findall(r"IDLE_CPU_MS (\d+)", out)]
    # 3 s idle: ~1500 empty rounds at a 2 ms cycle without the wait, ~60 with it (CPU read in 10 ms ticks)
    assert sum(cpu["50"]) * 3 < sum(cpu["0"]), cpu
