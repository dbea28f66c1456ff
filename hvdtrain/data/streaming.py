"""Data larger than memory: Parquet shard files streamed row group by row group.

The epoch's order is over row groups (shuffled with seed + epoch, the same on every rank; rows keep
their order inside a group). Rank r trains on the r-th contiguous block of that order, padded by
wrapping around so that every rank takes the same number of steps; inside the block, loader worker w
loads batches w, w+W, ... so the DataLoader's round-robin returns them in order and no sample is
read twice. A worker holds one row group at a time.

Resuming: the trainer's position (samples processed by all ranks) gives each rank its offset in its
block, so a run resumes at the right sample with the same number of workers (elastic resizing is not
supported for streams).
"""
from __future__ import annotations

import glob
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from hvdtrain.data.tabular import feature_names, features_of, labels_of
from hvdtrain.errors import UserError


@dataclass(frozen=True)
class Unit:
    """One row group of one file."""
    file: str
    group: int
    rows: int


def row_groups(files: list[str]) -> list[Unit]:
    """Every row group of every file, from the Parquet footers only (no data read)."""
    import pyarrow.parquet as pq

    units = []
    for file in files:
        try:
            meta = pq.ParquetFile(file).metadata
        except Exception as err:
            raise UserError(f"cannot read {file} as Parquet: {str(err).splitlines()[0][:160]}") from None
        units += [Unit(file, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)
                  if meta.row_group(g).num_rows]
    return units


def block(total: int, rank: int, size: int) -> tuple[int, int]:
    """[start, stop) of rank's block in the padded order (stop may pass `total`: it wraps around)."""
    length = math.ceil(total / size)
    return rank * length, (rank + 1) * length


def worker_batches(start: int, stop: int, batch_size: int, worker: int, workers: int) -> Iterator[tuple[int, int]]:
    """[begin, end) of the batches of [start, stop) that loader worker `worker` of `workers` loads."""
    batches = math.ceil((stop - start) / batch_size)
    for b in range(worker, batches, workers):
        yield start + b * batch_size, min(stop, start + (b + 1) * batch_size)


class ParquetStream(IterableDataset):
    """Args:
        files: Parquet shard files (all with the feature and label columns).
        features, label: columns, as for tabular data (features '' = all but the label).
        classes: the class list (from the data's metadata or a first pass); None for a regression label.
        batch_size: per rank, the trainer's; seed: the shuffle seed.
    """

    def __init__(self, files: list[str], features: str, label: str, classes: list[Any] | None,
                 batch_size: int, seed: int) -> None:
        import pyarrow.parquet as pq

        self.files, self.label, self.classes = files, label, classes
        self.units = row_groups(files)
        if not self.units:
            raise UserError(f"the shard files ({len(files)}) hold no rows")
        self.features = feature_names(pq.ParquetFile(files[0]).schema_arrow.names, features, label)
        self.total = sum(u.rows for u in self.units)
        self.batch_size, self.seed = batch_size, seed
        self.rank, self.size, self.epoch, self.start = 0, 1, 0, 0

    def __len__(self) -> int:
        return self.total

    def set_shard(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Begin `epoch` after `start` samples processed by all ranks together (0 = from its beginning)."""
        if start % self.size:
            raise UserError(f"cannot resume a stream at position {start} with {self.size} workers; resume with "
                            "the number of workers that wrote the checkpoint")
        self.epoch, self.start = epoch, start

    def shard_len(self) -> int:
        """Samples this rank still trains on this epoch."""
        first, stop = block(self.total, self.rank, self.size)
        return stop - first - self.start // self.size

    def order(self) -> list[Unit]:
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        return [self.units[i] for i in torch.randperm(len(self.units), generator=gen).tolist()]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        units = self.order()
        offsets = [0]
        for unit in units:
            offsets.append(offsets[-1] + unit.rows)
        first, stop = block(self.total, self.rank, self.size)
        reader = _GroupReader(self)
        for begin, end in worker_batches(first + self.start // self.size, stop, self.batch_size, worker, workers):
            for position in range(begin, end):
                at = position % self.total                       # padding wraps around to the beginning
                index = _unit_at(offsets, at)
                features, labels = reader.rows(units[index])
                row = at - offsets[index]
                yield features[row], labels[row]


def _unit_at(offsets: list[int], position: int) -> int:
    import bisect

    return bisect.bisect_right(offsets, position) - 1


class _GroupReader:
    """Reads row groups, keeping only the last one (the stream is sequential inside a block)."""

    def __init__(self, stream: ParquetStream) -> None:
        self.stream = stream
        self.key: tuple[str, int] | None = None
        self.cached: tuple[torch.Tensor, torch.Tensor] | None = None

    def rows(self, unit: Unit) -> tuple[torch.Tensor, torch.Tensor]:
        import pyarrow.parquet as pq

        if self.key != (unit.file, unit.group):
            s = self.stream
            table = pq.ParquetFile(unit.file).read_row_group(unit.group, columns=[*s.features, s.label])
            self.cached = (torch.from_numpy(features_of(table, s.features)), labels_of(table, s.label, s.classes)[0])
            self.key = (unit.file, unit.group)
        assert self.cached is not None
        return self.cached


def is_stream(train_data: Any, *, elastic: bool) -> bool:
    """True for a stream the trainer can shard (ParquetStream or the same protocol); a UserError for one
    it cannot, or for a stream in an elastic run."""
    if not isinstance(train_data, IterableDataset):
        return False
    if not all(hasattr(train_data, a) for a in ("set_shard", "set_epoch", "shard_len")):
        raise UserError(f"train_data is an IterableDataset ({type(train_data).__name__}) without set_shard/"
                        "set_epoch/shard_len, so its samples cannot be split across workers exactly; use a "
                        "map-style Dataset or hvdtrain.data.streaming.ParquetStream")
    if elastic:
        raise UserError("elastic training needs a map-style dataset (a stream cannot be re-split across a "
                        "changing number of workers); drop --elastic or load the data in memory")
    return True


def parquet_shards(pattern: str, features: str, label: str, val_fraction: float, batch_size: int,
                   seed: int) -> tuple[ParquetStream, Any, int]:
    """(train stream, held-out set in memory, num_classes) from the files matching `pattern`.

    The last round(val_fraction x files) files (at least one) are held out and loaded in memory.
    """
    import pyarrow.dataset as ds

    files = sorted(glob.glob(pattern))
    if len(files) < 2:
        raise UserError(f"shards {pattern} match {len(files)} file(s); streaming needs at least 2 (one held out)")
    n_val = max(1, round(len(files) * val_fraction))
    train_files, val_files = files[:-n_val], files[-n_val:]
    label_kind = ds.dataset(train_files[0], format="parquet").schema.field(label).type
    classes = None
    if not str(label_kind).startswith(("float", "double", "halffloat")):
        # Classes from the label column alone (one column of every file: small next to the data).
        values = ds.dataset(train_files, format="parquet").to_table(columns=[label]).column(label).to_pylist()
        classes = sorted(set(values))
    train = ParquetStream(train_files, features, label, classes, batch_size, seed)
    from torch.utils.data import TensorDataset

    val_table = ds.dataset(val_files, format="parquet").to_table(columns=[*train.features, label])
    val = TensorDataset(torch.from_numpy(features_of(val_table, train.features)),
                        labels_of(val_table, label, classes)[0])
    return train, val, len(classes) if classes is not None else 1
