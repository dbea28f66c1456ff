"""Tier 1: loader worker processes, seeds distinct per rank and per worker, order per epoch (no Horovod)."""
from __future__ import annotations

import torch
from torch.utils.data import Dataset, get_worker_info

from hvdtrain.config.train_config import load_config
from hvdtrain.data.loader import LoadingSettings, build_loader, loader_options
from hvdtrain.data.sharding import ShardSampler

CPU = torch.device("cpu")
SAMPLES = 48


class RandomAugment(Dataset):
    """A random 'augmentation' per sample, tagged with the sample index and the loader worker that made it."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        info = get_worker_info()
        return torch.rand(4), torch.tensor([index, info.id if info else -1])


def draw(rank: int, seed: int = 42, epochs: int = 2) -> list[tuple[list[int], list[int], torch.Tensor]]:
    """Per epoch: sample order, worker of each sample, augmentations; rank `rank` of 2, 2 loader workers."""
    torch.manual_seed(seed)  # as fit() does on every rank: seeds from the global RNG would repeat across ranks
    config = LoadingSettings.of(load_config(workers=2, batch_size=4, seed=seed))   # default start: forkserver
    sampler = ShardSampler(SAMPLES, rank, 2, seed=seed)
    loader = build_loader(RandomAugment(), sampler, config, rank, CPU)
    result = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        noise, meta = (torch.cat(parts) for parts in zip(*loader, strict=True))
        result.append((meta[:, 0].tolist(), meta[:, 1].tolist(), noise))
    return result


def test_two_ranks_by_two_workers_never_repeat_an_augmentation_and_order_follows_the_seed():
    rank0, rank1 = draw(0), draw(1)
    every = torch.cat([noise for _, _, noise in rank0 + rank1])
    assert len(every) == 2 * 2 * SAMPLES // 2
    assert len({tuple(row.tolist()) for row in every}) == len(every)  # no augmentation seen twice
    for epochs in (rank0, rank1):
        assert all(set(workers) == {0, 1} for _, workers, _ in epochs)  # both workers really worked
    # The shards of one epoch cover the dataset; set_epoch gives a new order.
    assert sorted(rank0[0][0] + rank1[0][0]) == list(range(SAMPLES))
    assert rank0[0][0] != rank0[1][0]
    # The same seed reproduces order and augmentations; another seed changes both.
    again = draw(0)
    assert [order for order, _, _ in again] == [order for order, _, _ in rank0]
    assert all(torch.equal(a[2], b[2]) for a, b in zip(again, rank0, strict=True))
    other = draw(0, seed=7, epochs=1)
    assert other[0][0] != rank0[0][0] and not torch.equal(other[0][2], rank0[0][2])


def test_loader_options():
    plain = loader_options(LoadingSettings.of(load_config()), 0, CPU)
    assert plain["num_workers"] == 0 and not plain["pin_memory"] and "prefetch_factor" not in plain
    many = loader_options(LoadingSettings.of(load_config(workers=3, prefetch_factor=4, mp_context="spawn")), 1,
                          torch.device("cuda", 0))
    assert many["pin_memory"] and many["prefetch_factor"] == 4 and many["persistent_workers"]
    assert many["multiprocessing_context"] == "spawn"
    assert plain["generator"].initial_seed() != many["generator"].initial_seed()  # rank 0 vs rank 1
