"""Rank-side: Horovod's collectives on bfloat16 tensors (hvdtrain's patched build) against float32 ones.

    horovodrun -np N --gloo|--mpi python tests/ranks/bf16_collectives.py

Each rank asserts: results stay bf16; sums and averages (plain, grouped and fused, pre/post-scaled as
DistributedOptimizer's) equal the float32 sum of the same bf16 values to bf16 precision; min/max, allgather,
broadcast, reducescatter and alltoall are exact. Prints "bf16 collectives OK" on success.
"""
from __future__ import annotations

import horovod.torch as hvd
import torch

hvd.init()
rank, size = hvd.rank(), hvd.size()
values = (torch.randn(1000, generator=torch.Generator().manual_seed(100 + rank)) * 100).to(torch.bfloat16)
exact = hvd.allreduce(values.float(), op=hvd.Sum, name="fp32.sum")  # the bf16 values, summed in float32
close = dict(rtol=2 ** -7, atol=0)    # bf16's 8-bit mantissa, rounded to nearest: within one step

total = hvd.allreduce(values, op=hvd.Sum, name="bf16.sum")
average = hvd.allreduce(values, op=hvd.Average, name="bf16.average")
assert total.dtype == average.dtype == torch.bfloat16
torch.testing.assert_close(total.float(), exact, **close)
torch.testing.assert_close(average.float(), exact / size, **close)
grouped = hvd.grouped_allreduce([values, values[:10].clone(), values[5:50].clone()], op=hvd.Sum, name="bf16.group")
torch.testing.assert_close(grouped[1].float(), exact[:10], **close)
torch.testing.assert_close(grouped[2].float(), exact[5:50], **close)
handle = hvd.allreduce_async_(values.clone(), op=hvd.Average, prescale_factor=0.5, postscale_factor=2.0,
                              name="bf16.scaled")
torch.testing.assert_close(hvd.synchronize(handle).float(), exact / size, rtol=2 ** -6, atol=0)

gathered = hvd.allgather(values.unsqueeze(0), name="bf16.gather")
assert gathered.dtype == torch.bfloat16 and gathered.shape == (size, 1000)
assert torch.equal(gathered[rank], values)
assert torch.equal(hvd.allreduce(values, op=hvd.Max, name="bf16.max"), gathered.max(0).values)
assert torch.equal(hvd.allreduce(values, op=hvd.Min, name="bf16.min"), gathered.min(0).values)
sent = values.clone() if rank == 0 else torch.zeros_like(values)
hvd.broadcast_(sent, root_rank=0, name="bf16.broadcast")
assert torch.equal(sent, gathered[0])
scattered = hvd.reducescatter(values, op=hvd.Sum, name="bf16.reducescatter")
assert scattered.dtype == torch.bfloat16 and scattered.numel() * size == values.numel()
swapped = hvd.alltoall(values, name="bf16.alltoall")
assert swapped.dtype == torch.bfloat16 and swapped.numel() == values.numel()
print(f"rank {rank}: bf16 collectives OK ({'MPI' if hvd.mpi_enabled() else 'Gloo'})", flush=True)
