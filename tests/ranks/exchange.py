"""Rank script for tests/multirank/test_exchange_allreduce.py: sums on 2 ranks as one exchange
(HOROVOD_EXCHANGE_ALLREDUCE, scripts/horovod/patches, 0009) give the ring's results, and how many writes Horovod's and
Gloo's threads make per small allreduce."""
import os
import threading

import horovod.torch as hvd
import torch


def other_threads_writes() -> int:
    """Write syscalls (write, writev) of this process's threads other than the main one: Gloo's messages and its
    send/receive notifications go out from Horovod's background thread and Gloo's loop thread."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != threading.get_native_id():
            with open(f"/proc/self/task/{tid}/io") as io:
                total += next(int(line.split()[1]) for line in io if line.startswith("syscw:"))
    return total


hvd.init()
rank = hvd.rank()
torch.manual_seed(rank)
for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.float64):
    mine = (torch.randn(1000) * 100).to(dtype)
    theirs = hvd.allgather(mine.unsqueeze(0), name=f"gather.{dtype}")
    expected = theirs[0] + theirs[1] if rank == 0 else theirs[1] + theirs[0]
    got = hvd.allreduce(mine, op=hvd.Sum, name=f"sum.{dtype}")
    assert torch.equal(got, expected), dtype   # a + b, bit for bit, on both ranks
average = hvd.allreduce(torch.full((7,), float(rank)), op=hvd.Average, name="average")
assert average.tolist() == [0.5] * 7
low = hvd.allreduce(torch.tensor([float(rank), 5.0 - rank]), op=hvd.Min, name="min")   # min keeps Gloo's ring
assert low.tolist() == [0.0, 4.0]
hvd.allreduce(torch.zeros(1), name="sync")
before = other_threads_writes()
for _ in range(100):
    assert hvd.allreduce(torch.ones(1000), op=hvd.Sum, name="loop")[0].item() == 2
print(f"WRITES_PER_ALLREDUCE {(other_threads_writes() - before) / 100:.2f}", flush=True)
print("exchange OK", flush=True)
