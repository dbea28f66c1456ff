"""Data larger than memory: Parquet shard files streamed row group by row group.

The epoch's order is over row groups (shuffled with seed + epoch, the same on every rank; rows are
shuffled inside their group, which is in memory anyway). Rank r trains on the r-th contiguous block
of that order, padded by wrapping around so that every rank takes the same number of steps; inside
the block, loader worker w loads batches w, w+W, ... so the DataLoader's round-robin returns them in
order and no sample is read twice. A worker holds one row group at a time.

Resuming: the trainer's position (samples processed by all ranks) gives each rank its offset in its
block, so a run resumes at the right sample; mid-epoch on another number of workers, the rest of each
old block is split anew (data/stream_layout.py), so every row of the epoch is still trained once.
Elastic resizing is not supported for streams.
"""
from __future__ import annotations

import glob
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from hvdtrain.data.shard_source import ShardSource
from hvdtrain.data.stream_layout import length, rank_part, take
from hvdtrain.data.tabular import feature_names, features_of, targets_of
from hvdtrain.errors import UserError, first_line


@dataclass(frozen=True)
class Unit:
    """One row group of one file."""
    file: str
    group: int
    rows: int


def row_groups(files: list[str], filesystem: Any = None) -> list[Unit]:
    """Every row group of every file, from the Parquet footers only (no data read)."""
    units = []
    for file in files:
        try:
            meta = open_parquet(file, filesystem).metadata
        except Exception as err:
            raise UserError(f"cannot read {file} as Parquet: {first_line(err, 160)}") from None
        units += [Unit(file, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)
                  if meta.row_group(g).num_rows]
    return units


def block(total: int, rank: int, size: int) -> tuple[int, int]:
    """[start, stop) of rank's block in the padded order (stop may pass `total`: it wraps around)."""
    length = math.ceil(total / size)
    return rank * length, (rank + 1) * length


def check_resume(position: int, written_by: int, size: int) -> None:
    """Refuse a mid-epoch resume on another number of workers, for a stream that cannot re-split (no
    `resplit`): the `position` samples already trained are the first position/written_by of each of
    written_by blocks, a set that `size` blocks cannot skip."""
    if position and written_by != size:
        raise UserError(f"cannot resume a stream mid-epoch ({position} samples in) with {size} workers: the "
                        f"checkpoint was written by {written_by}, and its blocks are not theirs; resume with "
                        f"{written_by} workers, or from a checkpoint at an epoch boundary")


def worker_batches(start: int, stop: int, batch_size: int, worker: int, workers: int) -> Iterator[tuple[int, int]]:
    """[begin, end) of the batches of [start, stop) that loader worker `worker` of `workers` loads."""
    batches = math.ceil((stop - start) / batch_size)
    for b in range(worker, batches, workers):
        yield start + b * batch_size, min(stop, start + (b + 1) * batch_size)


class ParquetStream(IterableDataset):
    """Args:
        files: Parquet shard files (all with the feature and label columns).
        features: columns, as for tabular data ('' = all but the label; a list or comma-separated).
        label: the label column, or a list of float columns (one [rows, k] regression target).
        classes: the class list (from the data's metadata or a first pass); None for a regression label.
        batch_size: per rank, the trainer's; seed: the shuffle seed.
        filesystem: a pyarrow FileSystem the files live on (a store's: HDFS, S3...); None = local paths.
    Rows are shuffled inside their row group too (seed, epoch, group), so a sorted table still mixes.
    `rows_read` counts the rows of the row groups this process loaded: what a rank held in memory.
    """

    def __init__(self, files: list[str], features: str | list[str], label: str | list[str],
                 classes: list[Any] | None, batch_size: int, seed: int, filesystem: Any = None) -> None:
        self.files, self.classes, self.filesystem = files, classes, filesystem
        self.labels = [label] if isinstance(label, str) else list(label)
        self.units = row_groups(files, filesystem)
        if not self.units:
            raise UserError(f"the shard files ({len(files)}) hold no rows")
        self.features = columns_of(files[0], features, self.labels, filesystem)
        self.total = sum(u.rows for u in self.units)
        self.batch_size, self.seed = batch_size, seed
        self.rank, self.size, self.epoch, self.start = 0, 1, 0, 0
        self.resplits: list[tuple[int, int]] = []   # this epoch's changes of workers (stream_layout.py)
        self.rows_read = 0

    def __len__(self) -> int:
        return self.total

    def reshard(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size

    def epoch_samples(self) -> int:
        return self.total

    def set_epoch(self, epoch: int, start: int = 0, resplits: list[tuple[int, int]] | None = None) -> None:
        """Begin `epoch` after `start` samples processed by all ranks together (0 = from its beginning);
        `resplits`: the epoch's earlier changes of workers (see resplit)."""
        since = resplits[-1][0] if resplits else 0
        if (start - since) % self.size:
            raise UserError(f"cannot resume a stream at position {start} with {self.size} workers; resume with "
                            "the number of workers that wrote the checkpoint")
        self.epoch, self.start, self.resplits = epoch, start, list(resplits or [])

    def resplit(self, resplits: list[tuple[int, int]], position: int, written_by: int) -> list[tuple[int, int]]:
        """The epoch's resplits after a resume `position` samples into it on this run's number of workers,
        where `written_by` workers stopped: the trainer keeps them in its progress (and checkpoints)."""
        return [*resplits, (position, written_by)] if written_by != self.size and position else resplits

    def part(self) -> list[tuple[int, int]]:
        """The positions of the epoch's order this rank still trains, as [begin, end) ranges."""
        return rank_part(self.total, self.resplits, self.start, self.rank, self.size)

    def shard_len(self) -> int:
        """Samples this rank still trains on this epoch."""
        return length(self.part())

    def order(self) -> list[int]:
        """Indices into self.units in this epoch's order."""
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.units), generator=gen).tolist()

    def row_order(self, unit: int) -> list[int]:
        gen = torch.Generator().manual_seed((self.seed + self.epoch) * 1_000_003 + unit)
        return torch.randperm(self.units[unit].rows, generator=gen).tolist()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        order = self.order()
        offsets = [0]
        for i in order:
            offsets.append(offsets[-1] + self.units[i].rows)
        part = self.part()
        reader = _GroupReader(self)
        rows: list[int] = []
        for begin, end in worker_batches(0, length(part), self.batch_size, worker, workers):
            for first, stop in take(part, begin, end):
                for at in range(first, stop):
                    index = _unit_at(offsets, at)
                    if reader.key != order[index]:
                        rows = self.row_order(order[index])
                    features, labels = reader.rows(order[index])
                    row = rows[at - offsets[index]]
                    yield features[row], labels[row]


class ParquetTable(Dataset):
    """Map-style rows of Parquet files in file order, holding one row group at a time: for held-out data
    that evaluation reads in increasing index order (rank r: r, r+size, ...), so each group loads once."""

    def __init__(self, files: list[str], features: str | list[str], label: str | list[str],
                 classes: list[Any] | None, filesystem: Any = None) -> None:
        self.files, self.classes, self.filesystem = files, classes, filesystem
        self.labels = [label] if isinstance(label, str) else list(label)
        self.units = row_groups(files, filesystem)
        self.features = columns_of(files[0], features, self.labels, filesystem) if files else []
        self.offsets = [0]
        for unit in self.units:
            self.offsets.append(self.offsets[-1] + unit.rows)
        self.rows_read = 0
        self._reader: _GroupReader | None = None

    def __len__(self) -> int:
        return self.offsets[-1]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        if self._reader is None:
            self._reader = _GroupReader(self)
        unit = _unit_at(self.offsets, index)
        features, labels = self._reader.rows(unit)
        return features[index - self.offsets[unit]], labels[index - self.offsets[unit]]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_reader": None}     # loader workers start without the parent's group


def open_parquet(file: str, filesystem: Any = None) -> Any:
    import pyarrow.parquet as pq

    return pq.ParquetFile(filesystem.open_input_file(file) if filesystem is not None else file)


def columns_of(file: str, features: str | list[str], labels: list[str], filesystem: Any = None) -> list[str]:
    names = open_parquet(file, filesystem).schema_arrow.names
    wanted = features if isinstance(features, str) else ",".join(features)
    found = feature_names(names, wanted, labels[0])
    missing = [n for n in labels[1:] if n not in names]
    if missing:
        raise UserError(f"label column(s) {', '.join(missing)} not in the data (columns: {', '.join(names)})")
    return [n for n in found if n not in labels]


def _unit_at(offsets: list[int], position: int) -> int:
    import bisect

    return bisect.bisect_right(offsets, position) - 1


def release_freed_memory() -> None:
    """Row groups are read and dropped one at a time, but pyarrow's mimalloc pool (its default in recent
    releases) keeps freed segments: a Spark test worker's peak memory grew by 53 MB for 2 MB row groups,
    over a quarter of its data (tests/cluster/test_spark_dataframe.py). The system allocator gives them
    back, and that test's bound holds again."""
    import pyarrow as pa

    if pa.default_memory_pool().backend_name == "mimalloc":
        pa.set_memory_pool(pa.system_memory_pool())


class _GroupReader:
    """Reads row groups, keeping only the last one (each reader's access is sequential)."""

    def __init__(self, source: ParquetStream | ParquetTable) -> None:
        release_freed_memory()
        self.source = source
        self.key: int | None = None
        self.cached: tuple[torch.Tensor, torch.Tensor] | None = None

    def rows(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.key != index:
            s, unit = self.source, self.source.units[index]
            self.cached = None                                   # let the old group go before reading
            table = open_parquet(unit.file, s.filesystem).read_row_group(unit.group, columns=[*s.features, *s.labels])
            self.cached = (torch.from_numpy(features_of(table, s.features)), targets_of(table, s.labels, s.classes)[0])
            self.key = index
            s.rows_read += unit.rows
        assert self.cached is not None
        return self.cached


def stream_source(train_data: Any, *, elastic: bool) -> ShardSource | None:
    """The stream itself, for a stream the trainer can shard (it is a ShardSource: ParquetStream, Stream, or
    your own); None for a map-style dataset; a UserError for a stream it cannot shard, or in an elastic run."""
    if not isinstance(train_data, IterableDataset):
        return None
    if not isinstance(train_data, ShardSource):
        raise UserError(f"train_data is an IterableDataset ({type(train_data).__name__}) without reshard/"
                        "epoch_samples/set_epoch/shard_len/resplit, so its samples cannot be split across workers "
                        "exactly; wrap it as "
                        "hvdtrain.data.streams.Stream(dataset, samples=N) (N samples per epoch), or use a "
                        "map-style Dataset or hvdtrain.data.streaming.ParquetStream")
    if elastic:
        raise UserError("elastic training needs a map-style dataset (a stream cannot be re-split across a "
                        "changing number of workers); drop --elastic or load the data in memory")
    return train_data


def parquet_shards(pattern: str, features: str, label: str, val_fraction: float, batch_size: int,
                   seed: int) -> tuple[ParquetStream, Any, int]:
    """(train stream, held-out ParquetTable, num_classes) from the files matching `pattern`.

    The last round(val_fraction x files) files (at least one) are held out (read one row group at a time).
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
    return train, ParquetTable(val_files, train.features, label, classes), len(classes) if classes is not None else 1
