"""Built-in datasets and plug-in datasets."""
from __future__ import annotations

import gzip
import importlib.util
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
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


def digits_arrays() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 8x8 digits as (images of pixels 0-16, float64 [N, 8, 8]; labels, int64 [N]).

    The same arrays as scikit-learn's ``load_digits()``, read from the CSV that ships inside its
    package without importing it: ``sklearn.datasets`` pulls in scipy.stats, ~1 s of CPU in every
    worker process only to read 1,797 rows.
    """
    spec = importlib.util.find_spec("sklearn")  # finds the package folder; imports nothing
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the digits dataset ships with scikit-learn, which is not installed; "
                        "pip install scikit-learn, or pick --dataset synthetic")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(path, "rt", encoding="utf-8") as rows:
        table = np.loadtxt(rows, delimiter=",")
    images = torch.from_numpy(table[:, :-1].reshape(-1, 8, 8))
    labels = torch.from_numpy(table[:, -1].astype(np.int64))
    return images, labels


def digits(config: TrainConfig) -> Data:
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, no download)."""
    images, labels = digits_arrays()
    inputs = images.to(torch.float32).unsqueeze(1) / 16.0
    return Data(*split(inputs, labels, config.val_fraction, config.seed), num_classes=10)


def synthetic(config: TrainConfig) -> Data:
    """Random inputs of any shape, labelled by a fixed random linear teacher so it is learnable."""
    gen = torch.Generator().manual_seed(config.seed)
    inputs = torch.randn(config.synthetic_samples, *config.synthetic_shape, generator=gen)
    teacher = torch.randn(math.prod(config.synthetic_shape), config.num_classes, generator=gen)
    targets = (inputs.flatten(1) @ teacher).argmax(dim=1)
    return Data(*split(inputs, targets, config.val_fraction, config.seed), config.num_classes)


BUILTIN = {"digits": digits, "synthetic": synthetic}
# Data without code: 'KIND:PATH'. These prefixes are not plug-in module names.
SOURCES = ("images", "csv", "parquet", "shards")


def from_source(config: TrainConfig) -> Data:
    """images:ROOT (ImageFolder layout), csv:FILE, parquet:FILE_OR_FOLDER, shards:GLOB (streamed Parquet)."""
    kind, _, path = config.dataset.partition(":")
    if kind == "images":
        from hvdtrain.data.images import image_folder

        return Data(*image_folder(path, config.image_size, config.val_fraction, config.seed))
    if kind in ("csv", "parquet"):
        from hvdtrain.data.tabular import tabular

        return Data(*tabular(path, config.features, config.label, config.val_fraction, config.seed))
    from hvdtrain.data.streaming import parquet_shards

    return Data(*parquet_shards(path, config.features, config.label, config.val_fraction, config.batch_size,
                                config.seed))


def build_data(config: TrainConfig) -> Data:
    if config.dataset.partition(":")[0] in SOURCES:
        return from_source(config)
    result = resolve(config.dataset, "dataset", BUILTIN)(config)
    if not (isinstance(result, tuple) and len(result) == 3):
        raise UserError(f"dataset builder {config.dataset} must return (train, val, num_classes), "
                        f"got {type(result).__name__}")
    return Data(*result)


def input_shape(dataset: Any) -> tuple[int, ...]:
    """The shape of one sample's inputs (for a model builder): item[0] of an (inputs, target) pair."""
    try:
        item = dataset[0]
    except (TypeError, NotImplementedError, IndexError):  # a stream: its first item
        item = next(iter(dataset))
    inputs = item[0] if isinstance(item, (list, tuple)) else item
    if not isinstance(inputs, torch.Tensor):
        raise UserError(f"the dataset's items are {type(item).__name__}, not (input tensor, target) pairs; "
                        "build the model yourself and use hvdtrain.Trainer with step_fn")
    return tuple(inputs.shape)
