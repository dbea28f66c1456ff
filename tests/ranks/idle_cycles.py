"""Rank script for tests/multirank/test_idle_cycles.py: collectives stay right when idle ranks wait for work
(HOROVOD_IDLE_CYCLE_TIME, scripts/horovod/patches, 0008), and what Horovod's threads cost while nothing is queued."""
import os
import threading
import time

import horovod.torch as hvd
import torch


def other_threads_cpu_s() -> float:
    """CPU seconds of this process's threads other than the main one (Horovod's and Gloo's)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != threading.get_native_id():
            with open(f"/proc/self/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


hvd.init()
rank, size = hvd.rank(), hvd.size()
if rank == 1:
    time.sleep(0.3)   # the other rank's round waits for this one's first enqueue
assert hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum).item() == size * (size + 1) / 2
handles = [hvd.allreduce_async(torch.full((1000,), float(rank + i)), op=hvd.Sum, name=f"t{i}") for i in range(20)]
for i, handle in enumerate(handles):
    assert torch.equal(hvd.synchronize(handle), torch.full((1000,), float(size * i + size * (size - 1) / 2)))
grouped = hvd.grouped_allreduce([torch.ones(3) * rank, torch.ones(5)], op=hvd.Sum)
assert grouped[0].tolist() == [sum(range(size))] * 3 and grouped[1].tolist() == [float(size)] * 5
for _ in range(3 if rank == 0 else 1):   # uneven work, then join
    hvd.allreduce(torch.ones(2), name="uneven")
hvd.join()
hvd.allreduce(torch.zeros(1), name="sync")
before = other_threads_cpu_s()
time.sleep(3)   # nothing queued on any rank
print(f"IDLE_CPU_MS {1000 * (other_threads_cpu_s() - before):.0f}", flush=True)
assert hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, name="after").item() == size
print("idle cycles OK", flush=True)
