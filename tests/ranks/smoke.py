"""Rank-side smoke test: real allreduce and broadcast, asserted on every rank."""
import torch

from hvdtrain.distributed import collectives, runtime

world = runtime.init()
assert world.size == 2, world
total = collectives.allreduce_sum(torch.tensor([world.rank + 1.0, 10.0]), name="smoke_sum")
assert torch.equal(total, torch.tensor([3.0, 20.0])), total
value = collectives.broadcast_object({"from": world.rank, "payload": [1, 2, 3]}, name="smoke_bcast")
assert value == {"from": 0, "payload": [1, 2, 3]}, value
gathered = collectives.allgather_object(world.rank, name="smoke_gather")
assert gathered == [0, 1], gathered
print(f"SMOKE-OK rank={world.rank} size={world.size}", flush=True)
runtime.shutdown()
