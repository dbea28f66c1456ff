"""What this rank reads of an epoch: one protocol that the sampler of a map-style dataset (data/sharding.py
ShardSampler) and the streams (data/streaming.py ParquetStream, data/streams.py Stream) all implement, so the
Trainer speaks one vocabulary and never asks which kind it holds (the one vocabulary Horovod's ElasticSampler
has for its samplers).

The position within an epoch is one global number, the samples all ranks together have processed; a source
turns it into this rank's remaining samples.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

# (position, workers before) for each change of the number of workers within an epoch (data/stream_layout.py).
Resplits = list[tuple[int, int]]


@runtime_checkable
class ShardSource(Protocol):
    def reshard(self, rank: int, size: int) -> None:
        """This rank of `size` from now on (the start, and every elastic resize)."""

    def epoch_samples(self) -> int:
        """Samples in one epoch over all ranks (fewer than the data holds with a DataLoader's drop_last)."""

    def set_epoch(self, epoch: int, start: int = 0, resplits: Resplits | None = None) -> None:
        """Begin `epoch`, `start` samples (over all ranks) into it; `resplits`: the epoch's earlier changes of
        workers, as `resplit` returned them (kept in the progress and its checkpoints)."""

    def shard_len(self) -> int:
        """Samples this rank still reads in the epoch set last."""

    def resplit(self, resplits: Resplits, position: int, written_by: int) -> Resplits:
        """A resume `position` samples into an epoch that `written_by` workers stopped, on this source's number
        of workers: the epoch's resplits from now on, or a one-line UserError where this source cannot go on."""
