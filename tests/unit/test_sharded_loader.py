"""Tier 1: the position a prepared loader records (hvdtrain/train/own_loop.py's ShardedLoader), without Horovod:
the samples all workers together were handed, and a loader restored from it that goes on with the next batch."""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from hvdtrain.data.sharding import ShardSampler
from hvdtrain.train.own_loop import ShardedLoader


def loader(rank: int, size: int = 2, n: int = 22, batch: int = 3) -> ShardedLoader:
    sampler = ShardSampler(n, rank, size, seed=5)
    return ShardedLoader(DataLoader(TensorDataset(torch.arange(n)), batch_size=batch, sampler=sampler), sampler, batch)


def indices(batches) -> list[int]:
    return [int(i) for (batch,) in batches for i in batch]


def test_the_position_counts_every_workers_batches_and_stops_at_the_epochs_end():
    worker = loader(rank=0)
    worker.set_epoch(1)
    batches = iter(worker)
    next(batches), next(batches)
    assert worker.state_dict() == {"epoch": 1, "position": 12}        # 2 batches x 3 samples x 2 workers
    list(batches)
    assert worker.state_dict() == {"epoch": 1, "position": 22}        # the short last batch: the epoch's end


def test_a_restored_loader_goes_on_with_the_next_batch_and_the_next_epoch_starts_afresh():
    whole = {rank: loader(rank) for rank in (0, 1)}
    for worker in whole.values():
        worker.set_epoch(1)
    expected = {rank: indices(worker) for rank, worker in whole.items()}
    for rank in (0, 1):
        resumed = loader(rank)
        resumed.load_state_dict({"epoch": 1, "position": 12})
        resumed.set_epoch(1)
        assert indices(resumed) == expected[rank][6:]                  # 2 batches of 3 done on each worker
        resumed.set_epoch(2)
        assert len(indices(resumed)) == 11                             # a new epoch: all of this worker's shard


def test_a_restored_loader_resumes_with_another_number_of_workers():
    one = loader(rank=0, size=1)
    one.set_epoch(0)
    order = indices(one)
    halves = []
    for rank in (0, 1):
        resumed = loader(rank, size=2)
        resumed.load_state_dict({"epoch": 0, "position": 9})           # written by the one-worker run
        halves.append(indices(resumed))                                # no set_epoch: the loaded epoch
    # the 13 left, padded to 7 a worker with the order's first sample (as DistributedSampler pads)
    assert sorted(halves[0] + halves[1]) == sorted(order[9:] + order[:1]) and len(halves[0]) == len(halves[1])
