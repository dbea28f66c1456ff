"""A DataLoader the user already has: keep everything it says about loading, replace only who samples.

Accelerate's `prepare(dataloader)` does the same: the batch size, collate function, workers, pinned
memory, worker init and generator stay the user's; the sampler becomes hvdtrain's per-rank shard
(ShardSampler), so each rank trains on its share, every rank takes the same number of steps, and a
checkpoint resumes at the right sample. A loader whose batches or order come from something hvdtrain
cannot shard (a custom batch_sampler, a weighted sampler) is refused in one line.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    default_collate,
)
from torch.utils.data.distributed import DistributedSampler

from hvdtrain.errors import UserError

# DataLoader arguments carried over as they are (the sampler, batch size and drop_last are decided here).
KEPT = ("num_workers", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context", "generator",
        "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order")


@dataclass(frozen=True)
class LoaderSettings:
    """How the user's loader loads: everything but the sampler."""
    batch_size: int
    shuffle: bool
    drop_last: bool = False
    collate_fn: Callable[[list[Any]], Any] | None = None
    options: dict[str, Any] = field(default_factory=dict)   # KEPT arguments, as the user set them

    @property
    def collate(self) -> Callable[[list[Any]], Any]:
        return self.collate_fn or default_collate


def _shuffles(sampler: Any, role: str) -> bool:
    if isinstance(sampler, RandomSampler):
        if sampler.replacement or sampler._num_samples is not None:  # noqa: SLF001 - torch keeps it private
            raise UserError(f"the {role} DataLoader samples with replacement or a num_samples of its own, which "
                            "hvdtrain cannot split across workers; use shuffle=True without a sampler")
        return True
    if isinstance(sampler, SequentialSampler):
        return False
    if isinstance(sampler, DistributedSampler):      # DDP code brought along: its shuffle choice is kept
        return bool(sampler.shuffle)
    raise UserError(f"the {role} DataLoader has a {type(sampler).__name__}, which hvdtrain cannot split across "
                    "workers; pass shuffle=True/False instead of a sampler (hvdtrain gives each worker its "
                    "shard), or pass the Dataset itself")


def unwrap(data: Any, role: str = "train") -> tuple[Any, LoaderSettings | None]:
    """(dataset, the loader's settings) for a DataLoader; (data, None) for anything else.

    Example:
        >>> dataset, settings = unwrap(DataLoader(ds, batch_size=16, shuffle=True, collate_fn=pad))
        >>> settings.batch_size, settings.shuffle, settings.collate_fn is pad
        (16, True, True)
    """
    if not isinstance(data, DataLoader):
        return data, None
    options = {key: getattr(data, key) for key in KEPT if hasattr(data, key)}
    collate = None if data.collate_fn is default_collate else data.collate_fn
    if isinstance(data.dataset, IterableDataset):
        return data.dataset, LoaderSettings(data.batch_size or 1, False, data.drop_last, collate, options)
    if data.batch_size is None:
        kind = type(data.batch_sampler).__name__ if data.batch_sampler is not None else "no batching"
        raise UserError(f"the {role} DataLoader batches with a custom batch_sampler ({kind}), which hvdtrain "
                        "cannot split across workers; give it batch_size= and shuffle= instead (hvdtrain "
                        "shards the samples), or pass the Dataset with --batch-size")
    if not isinstance(data.batch_sampler, BatchSampler) or type(data.batch_sampler) is not BatchSampler:
        raise UserError(f"the {role} DataLoader batches with {type(data.batch_sampler).__name__}, which hvdtrain "
                        "cannot split across workers; use batch_size= and shuffle= instead")
    return data.dataset, LoaderSettings(data.batch_size, _shuffles(data.sampler, role), data.drop_last, collate,
                                        options)


@dataclass(frozen=True)
class Prepared:
    """What the Trainer trains and evaluates on, whatever form the user handed it in."""
    train: Any                       # a Dataset (map-style or a stream)
    val: Any
    settings: LoaderSettings | None  # how to load the training data; None = the config's options
    val_collate: Callable[[list[Any]], Any] | None
    val_batch_size: int | None       # the user's held-out DataLoader's batch size; None = eval_batch_size


def collate_plugin(spec: str) -> Callable[[list[Any]], Any] | None:
    """--collate-fn 'module:function' (a plug-in on every host's PYTHONPATH), or None for torch's default."""
    if not spec:
        return None
    from hvdtrain.config.plugins import resolve

    return resolve(spec, "collate-fn", {})


def prepare(train: Any, val: Any, collate_fn: Callable[[list[Any]], Any] | None, collate_spec: str,
            batch_size: int) -> Prepared:
    """Datasets and loading settings from Datasets or DataLoaders, a Trainer collate_fn, or --collate-fn."""
    train, settings = unwrap(train, "train")
    val, val_settings = unwrap(val, "val")
    collate = collate_fn or (settings.collate_fn if settings else None) or collate_plugin(collate_spec)
    if settings is None and collate is not None:
        settings = LoaderSettings(batch_size, shuffle=True, collate_fn=collate)
    elif settings is not None and collate is not settings.collate_fn:
        settings = LoaderSettings(settings.batch_size, settings.shuffle, settings.drop_last, collate, settings.options)
    val_collate = val_settings.collate_fn if val_settings and val_settings.collate_fn else collate
    return Prepared(train, val, settings, val_collate, val_settings.batch_size if val_settings else None)
