"""The training DataLoader: worker processes, pinned memory, and random seeds distinct per rank and worker.

Each epoch torch draws one base seed from the loader's generator and seeds loader worker w with
base + w (torch, `random` and numpy). Every rank would draw the same base seed from the same
global seed and repeat the other ranks' random augmentations, so the generator here is seeded
from (seed, rank): the same run reproduces the same augmentations, and no two (rank, worker) pairs
share a stream. Over a sharded Dataset, workers go further and seed each sample from (seed, epoch,
index) (data/sample_seeds.py), so a run resumed mid-epoch draws the same augmentations as one never stopped.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.data.sample_seeds import EpochIndices, SeededSamples
from hvdtrain.data.sharding import ShardSampler
from hvdtrain.data.user_loader import LoaderSettings
from hvdtrain.data.worker_lifetime import StopWithTrainer


def loader_seed(seed: int, rank: int) -> int:
    """A 63-bit seed for rank `rank`'s loader generator; distinct ranks get unrelated streams."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(2, np.uint64)[0] >> np.uint64(1))


@dataclass(frozen=True)
class LoadingSettings:
    """What the training loader reads of the config (a DataLoader the user passed overrides all but the seed)."""

    seed: int                   # --seed: with the rank, the loader generator's seed
    batch_size: int             # per worker
    workers: int                # loader worker processes per rank; 0 = load in the training process
    prefetch_factor: int        # batches each loader worker prepares ahead
    persistent_workers: bool    # loader workers kept across epochs
    mp_context: str             # loader workers' start method

    @classmethod
    def of(cls, config: TrainConfig) -> LoadingSettings:
        return cls(config.seed, config.batch_size, config.workers, config.prefetch_factor,
                   config.persistent_workers, config.mp_context)


def loader_options(settings: LoadingSettings, rank: int, device: torch.device) -> dict[str, Any]:
    """Keyword arguments for DataLoader: workers, prefetch, start method, seeds."""
    options: dict[str, Any] = {
        "num_workers": settings.workers,
        # Page-locked host memory makes the copy to the GPU asynchronous; on CPU it is wasted work.
        "pin_memory": device.type == "cuda",
        "generator": torch.Generator().manual_seed(loader_seed(settings.seed, rank)),
    }
    if settings.workers:
        # Horovod: forking a process that has initialised MPI (or CUDA) is unsafe with some interconnects;
        # forkserver starts workers from a clean server process instead.
        options.update(prefetch_factor=settings.prefetch_factor, persistent_workers=settings.persistent_workers,
                       multiprocessing_context=settings.mp_context)
    return options


def build_loader(data: Any, sampler: Sampler[Any] | None, settings: LoadingSettings, rank: int,
                 device: torch.device, user: LoaderSettings | None = None) -> DataLoader:
    """The training loader over `sampler`'s shard (the sampler decides order; workers only load).
    A streaming dataset (sampler None) shards itself across ranks and loader workers. `user` (from a
    DataLoader the user passed, or a collate function) wins over `settings`' loading options.

    Example:
        >>> loader = build_loader(train_ds, ShardSampler(len(train_ds), rank, size, seed=42),
        ...                       LoadingSettings.of(config), rank, torch.device("cpu"))
    """
    options = loader_options(settings, rank, device)
    if user is not None and user.options:
        options = {**user.options}
        if options.get("generator") is None:
            options["generator"] = loader_options(settings, rank, device)["generator"]
    if sampler is None and options.get("num_workers"):
        # A stream's workers read the epoch and position set on the dataset when the epoch's iterator is
        # made: persistent workers would keep the first epoch's copy.
        options["persistent_workers"] = False
    if isinstance(sampler, ShardSampler) and options.get("num_workers"):
        # Augmentations drawn per sample, not per worker stream: a mid-epoch resume draws what it would have.
        data, sampler = SeededSamples(data, settings.seed), EpochIndices(sampler)
    if options.get("num_workers"):
        # Under forkserver the workers would outlive a SIGKILLed training process (data/worker_lifetime.py).
        options["worker_init_fn"] = StopWithTrainer(os.getpid(), options.get("worker_init_fn"))
    batch_size = user.batch_size if user is not None else settings.batch_size
    collate = user.collate_fn if user is not None else None
    return DataLoader(data, batch_size=batch_size, sampler=sampler, collate_fn=collate, **options)


def rebuild_user_loader(data: Any, sampler: ShardSampler, user: LoaderSettings, *, seed: int, rank: int,
                        device: torch.device) -> DataLoader:
    """A user's DataLoader again, over `sampler`'s shard: everything it says about loading kept (batch size,
    collate_fn, workers...), its generator seeded from (seed, rank) where it had none (hvdtrain.prepare)."""
    settings = LoadingSettings(seed, user.batch_size, int(user.options.get("num_workers") or 0), 2, False, "spawn")
    return build_loader(data, sampler, settings, rank, device, user)
