"""Tier 3: hvdtrain's 2-rank exchange allreduce (scripts/horovod/patches, 0009), 2 real workers, Gloo: a sum is a + b
bit for bit in every dtype, average/min stay right, and a small allreduce makes fewer writes than Gloo's ring
(HOROVOD_EXCHANGE_ALLREDUCE=0)."""
from __future__ import annotations

import re

import pytest
from support.processes import horovod_patched, horovodrun, show


@pytest.mark.skipif(not horovod_patched("HOROVOD_EXCHANGE_ALLREDUCE"),
                    reason="this Horovod lacks hvdtrain's exchange allreduce: re-run make setup")
def test_a_two_rank_sum_is_one_exchange_with_the_rings_result():
    writes = {}
    for exchange in ("4194304", "0"):
        # A 20 ms cycle: each allreduce is enqueued long before the next cycle, so every one takes exactly one
        # negotiation round; at the default 1 ms a loaded machine adds idle rounds that drown the count.
        proc = horovodrun(2, ["tests/ranks/exchange.py"], "gloo",
                          env={"HOROVOD_EXCHANGE_ALLREDUCE": exchange, "HOROVOD_CYCLE_TIME": "20"})
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0 and out.count("exchange OK") == 2, show(proc)
        writes[exchange] = sum(float(n) for n in re.findall(r"WRITES_PER_ALLREDUCE ([\d.]+)", out))
    # 4 KB: Gloo's ring sends 4 segments each way, the exchange one message (plus each's negotiation round).
    assert writes["0"] > 2 * writes["4194304"], writes
