"""Built-in datasets, plug-in datasets, and how they are split across workers (pure functions)."""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch.utils.data import TensorDataset

from hvdtrain.config.plugins import resolve
from hvdtrain.config.train_config import TrainConfig
from hvdtrain.errors import UserError


class Data(NamedTuple):
    """What a dataset builder returns: plug-ins may return this or a plain 3-tuple."""
    train: Any          # a torch map-style Dataset of (input, label) with __len__
    val: Any
    num_classes: int


def split(inputs: torch.Tensor, targets: torch.Tensor, val_fraction: float, seed: int) -> tuple[
        TensorDataset, TensorDataset]:
    order = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(seed))
    n_val = max(1, round(len(inputs) * val_fraction))
    val, train = order[:n_val], order[n_val:]
    return TensorDataset(inputs[train], targets[train]), TensorDataset(inputs[val], targets[val])


def digits(config: TrainConfig) -> Data:
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, no download)."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    inputs = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    targets = torch.tensor(bunch.target, dtype=torch.long)
    return Data(*split(inputs, targets, config.val_fraction, config.seed), num_classes=10)


def synthetic(config: TrainConfig) -> Data:
    """Random inputs of any shape, labelled by a fixed random linear teacher so it is learnable."""
    gen = torch.Generator().manual_seed(config.seed)
    inputs = torch.randn(config.synthetic_samples, *config.synthetic_shape, generator=gen)
    teacher = torch.randn(math.prod(config.synthetic_shape), config.num_classes, generator=gen)
    targets = (inputs.flatten(1) @ teacher).argmax(dim=1)
    return Data(*split(inputs, targets, config.val_fraction, config.seed), config.num_classes)


BUILTIN = {"digits": digits, "synthetic": synthetic}


def build_data(config: TrainConfig) -> Data:
    result = resolve(config.dataset, "dataset", BUILTIN)(config)
    if not (isinstance(result, tuple) and len(result) == 3):
        raise UserError(f"dataset builder {config.dataset} must return (train, val, num_classes), "
                        f"got {type(result).__name__}")
    return Data(*result)


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
