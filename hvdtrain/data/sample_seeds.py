"""Random augmentations in loader workers drawn per sample, so a resumed run draws what it would have.

A loader worker's random generators run on from its epoch seed, sample after sample. A run resumed in the
middle of an epoch starts new workers at the resume point, so every later sample would get other draws than
in the run that was not interrupted. Here a worker seeds torch, `random` and numpy before each sample from
(run seed, epoch, sample index): which worker, and whether the run stopped before, no longer matter.
The loader process itself (no workers) needs none of this: its generators are in the checkpoint.
"""
from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from hvdtrain.data.sharding import ShardSampler


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed for sample `index` in `epoch`; unrelated streams for neighbouring indices."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1, np.uint64)[0] >> np.uint64(1))


def reseed(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


class EpochIndices(Sampler[tuple[int, int]]):
    """The shard's indices as (epoch, index): a worker gets the epoch with each sample, even a persistent
    worker that holds the dataset copy of the first epoch."""

    def __init__(self, sampler: ShardSampler) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.sampler.epoch
        return ((epoch, index) for index in self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


class SeededSamples(Dataset[Any]):
    """`data`, read by (epoch, index) with the generators seeded per sample first (per batch where `data`
    reads whole batches, e.g. a Hugging Face dataset's __getitems__: its batches are the same after a resume)."""

    def __init__(self, data: Any, seed: int) -> None:
        self.data, self.seed = data, seed
        # torch's fetcher takes a batch at once when the dataset has a true __getitems__
        self.__getitems__: Any = self._batch if callable(getattr(data, "__getitems__", None)) else None

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        reseed(sample_seed(self.seed, epoch, index))
        return self.data[index]

    def _batch(self, keys: list[tuple[int, int]]) -> Any:
        epoch, first = keys[0]
        reseed(sample_seed(self.seed, epoch, first))
        return self.data.__getitems__([index for _, index in keys])
