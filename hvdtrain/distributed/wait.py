"""Waiting for Horovod ops by sleeping, not spinning."""
from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

from hvdtrain.distributed.runtime import hvd

# Horovod's synchronize() waits by spinning: poll, release the GIL, sched_yield, again
# (WaitAndClear in horovod/torch/mpi_ops_v2.cc, 0.28.1). A rank that reaches the allreduce first burns
# its core until the slowest rank arrives and the bytes have moved, and with one core per rank that is
# the core its background threads need to move them (benchmarks/README.md, Issue #20 (2026-12-04),
# "Horovod's synchronize() spins"). hvdtrain sleeps between polls instead, backing off from the first
# to the last interval; synchronize() then finds the op done and returns at once. HVDTRAIN_WAIT=spin
# keeps Horovod's own wait.
WAIT_SLEEP_S = (50e-6, 400e-6)


def wait_quietly(handles: Iterable[Any]) -> None:
    """Return once these Horovod handles are done, sleeping (not spinning) while they are not."""
    if os.environ.get("HVDTRAIN_WAIT") == "spin":
        return
    first, last = WAIT_SLEEP_S
    for handle in handles:
        delay = first
        while not hvd.poll(handle):
            time.sleep(delay)
            delay = min(delay * 2, last)
