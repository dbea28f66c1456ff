"""Which samples each rank trains on: a resumable, re-shardable replacement for DistributedSampler.

The position within an epoch is one global number: how many samples of this epoch's shuffled order
all ranks together have processed. Because ranks take the remaining order strided (rank r gets
r, r+size, ...), after k equal batches the processed samples are exactly a prefix of the order. So
the same position resumes a checkpoint, survives an elastic reset, and re-splits the rest of the
epoch across any new number of workers with no sample skipped or repeated.
"""
from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

from hvdtrain.data.shard_source import Resplits
from hvdtrain.errors import UserError


class ShardSampler(Sampler[int]):
    """Per-epoch shuffle (seed + epoch, the same on every rank), strided shards padded to equal length.

    With start=0 it yields exactly what torch's DistributedSampler(shuffle=True, drop_last=False) does.
    A ShardSource (data/shard_source.py).
    """

    def __init__(self, num_samples: int, rank: int, size: int, seed: int, shuffle: bool = True,
                 drop_last_batch: int = 0) -> None:
        self.num_samples_total = num_samples
        self.seed = seed
        self.shuffle = shuffle
        # DataLoader(drop_last=True) with batches of this size: each epoch keeps the largest multiple of
        # size x batch of its order, so every rank's last batch is whole and the ranks stay equal.
        self.drop_last_batch = drop_last_batch
        self.epoch = 0
        self.start = 0
        self.rank, self.size = rank, size

    def set_epoch(self, epoch: int, start: int = 0, resplits: Resplits | None = None) -> None:
        """Begin `epoch`, skipping the first `start` samples of its order (already processed). The strided
        order needs no `resplits`: after any number of workers the processed samples are a prefix of it."""
        self.epoch, self.start = epoch, start

    def reshard(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size

    def resplit(self, resplits: Resplits, position: int, written_by: int) -> Resplits:
        return resplits   # the rest of the order is strided anew over any number of workers

    def shard_len(self) -> int:
        return len(self)

    def epoch_samples(self) -> int:
        """Samples in an epoch's order: all of them, or fewer with drop_last."""
        if not self.drop_last_batch:
            return self.num_samples_total
        whole = self.size * self.drop_last_batch
        return self.num_samples_total // whole * whole

    def order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.epoch_samples()))
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_samples_total, generator=gen).tolist()[:self.epoch_samples()]

    def shard(self) -> list[int]:
        """This rank's samples from `start` to the epoch's end, strided over the epoch's order read on past
        its end (wrapping to its first samples) up to a multiple of the workers, as DistributedSampler pads.

        The padding wraps from the start of the epoch's order, never from `start`: it is then a function
        of the epoch alone, so a run resumed mid-epoch trains the same last step as one never stopped
        (wrapping from the resume point once made the two differ whenever the workers did not divide the
        epoch). After an elastic resize the new workers pad from the same place.
        """
        order = self.order()
        total = len(order)
        if self.start >= total:
            return []
        stop = self.start + -(-(total - self.start) // self.size) * self.size
        return [order[i % total] for i in range(self.start + self.rank, stop, self.size)]

    def __iter__(self) -> Iterator[int]:
        return iter(self.shard())

    def __len__(self) -> int:
        remaining = max(0, self.epoch_samples() - self.start)
        return -(-remaining // self.size)


def check_fits(train_size: int, size: int) -> None:
    if train_size < size:
        raise UserError(f"the training set has {train_size} samples, fewer than the {size} workers; "
                        "use fewer workers or a larger dataset")


def steps_per_epoch(train_size: int, size: int, batch_size: int, accumulate: int = 1) -> int:
    """Optimizer steps, equal on every rank: DistributedSampler pads each shard to ceil(n / size) samples.

    With accumulation a step takes `accumulate` micro-batches; the epoch's last step may take fewer.
    """
    return math.ceil(math.ceil(math.ceil(train_size / size) / batch_size) / accumulate)


def step_samples(micro: int, batch_size: int, accumulate: int, shard_len: int) -> int:
    """Samples of this rank's shard in the optimizer step that micro-batch `micro` belongs to.

    K full micro-batches, except at the end of the shard (a short last batch, a short last step).
    Weighting each micro-batch's mean loss by len(batch) / step_samples makes the step's gradient the
    mean over all its samples: K micro-batches of b equal one batch of K*b.
    """
    first = micro // accumulate * accumulate * batch_size
    return min(shard_len, first + accumulate * batch_size) - first


def eval_shard(n: int, rank: int, size: int) -> range:
    """Strided, unpadded: across ranks every held-out sample is counted exactly once."""
    return range(rank, n, size)
