"""Streams from other libraries (Hugging Face `datasets` streaming, webdataset, mosaicml-streaming) in
the Trainer, with every rank taking the same number of steps.

A stream has no length the trainer can divide, and a rank that runs out of data before the others
leaves them waiting in an allreduce for ever (the end-of-epoch hang). `Stream` gives it the trainer's
ShardSource protocol (data/shard_source.py): each rank takes exactly ceil(samples / size) items per
epoch, wrapping around its own part if that part is short (as DistributedSampler pads), and stops
there if it is long. Which items are a rank's part: Hugging Face's `split_dataset_by_node` with
Horovod's rank and size for its IterableDataset; the library's own node splitter for webdataset and
mosaicml-streaming, which read RANK/WORLD_SIZE (exported on every worker: environment/process.py).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from hvdtrain.data.shard_source import Resplits
from hvdtrain.data.streaming import check_resume
from hvdtrain.errors import UserError

Split = Callable[[Any, int, int], Any]


def hf_split(dataset: Any, rank: int, size: int) -> Any:
    """Hugging Face's own node split: whole shards per rank when they divide evenly, else 1 item in `size`."""
    from datasets.distributed import split_dataset_by_node

    return split_dataset_by_node(dataset, rank=rank, world_size=size)


def is_hf_iterable(dataset: Any) -> bool:
    return type(dataset).__module__.startswith("datasets.") and type(dataset).__name__ == "IterableDataset"


class Stream(IterableDataset):
    """Args:
        dataset: an iterable dataset (a Hugging Face IterableDataset, a webdataset pipeline, ...).
        samples: samples in one epoch over all ranks (the dataset's size); every rank takes
            ceil(samples / workers) of them per epoch.
        split: `split(dataset, rank, size)` -> this rank's part; default: Hugging Face's split for its
            IterableDataset, and none for other libraries (they split by RANK/WORLD_SIZE themselves,
            e.g. webdataset's `nodesplitter=wds.split_by_node`).
    Example:
        >>> hvdtrain.Trainer(model, Stream(load_dataset(..., streaming=True)["train"], samples=120_000),
        ...                  collate_fn=pad)
    """

    def __init__(self, dataset: Any, samples: int, split: Split | None = None) -> None:
        if not isinstance(samples, int) or samples < 1:
            raise UserError(f"Stream(samples=...) must be the number of samples in an epoch (>= 1), got {samples!r}")
        self.dataset, self.samples = dataset, samples
        self.split = split if split is not None else hf_split if is_hf_iterable(dataset) else None
        self.rank, self.size, self.epoch, self.start = 0, 1, 0, 0

    def __len__(self) -> int:
        return self.samples

    def reshard(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size

    def epoch_samples(self) -> int:
        return self.samples

    def resplit(self, resplits: Resplits, position: int, written_by: int) -> Resplits:
        check_resume(position, written_by, self.size)   # another library's stream cannot re-split its blocks
        return resplits

    def set_epoch(self, epoch: int, start: int = 0, resplits: Resplits | None = None) -> None:
        """Begin `epoch`, `start` samples (over all ranks) into it: each rank skips start / size of its own.
        `resplits` is always empty here (`resplit` refuses what would need them)."""
        if start % self.size:
            raise UserError(f"cannot resume a stream {start} samples into an epoch on {self.size} workers (not a "
                            "multiple of the workers: the checkpoint was written by another number of workers); "
                            "resume with the same number of workers")
        self.epoch, self.start = epoch, start

    def shard_len(self) -> int:
        return math.ceil(self.samples / self.size) - self.start // self.size

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if info is not None and info.num_workers > 1:
            raise UserError("a Stream is read by one loader process per rank (each worker would need an exact "
                            "share of the rank's items); use --workers 0 or 1 (the library can still prefetch)")
        part = self.split(self.dataset, self.rank, self.size) if self.split else self.dataset
        if hasattr(part, "set_epoch"):
            part.set_epoch(self.epoch)      # the library's own per-epoch shuffle, where it has one
        wanted = math.ceil(self.samples / self.size)
        # Wrap around a short part (a fresh pass each time) so that every rank yields `wanted` items.
        passes = itertools.chain.from_iterable(_passes(part))
        return itertools.islice(passes, self.start // self.size, wanted)


_END = object()


def _passes(part: Any) -> Iterator[Iterator[Any]]:
    while True:
        first = iter(part)
        head = next(first, _END)
        if head is _END:
            raise UserError("a rank's part of the stream is empty (fewer shards than workers?); give the stream "
                            "at least as many shards as workers, or fewer workers")
        yield itertools.chain([head], first)
