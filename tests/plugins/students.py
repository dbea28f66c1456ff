"""Plug-in students for `hvdtrain compress --method distill` tests."""
from __future__ import annotations

from torch import nn


def five_classes(config, input_shape, num_classes):
    """Ignores num_classes: 5 outputs for a 10-class dataset, so it does not fit the data."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 5))


def tiny(config, input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 24), nn.ReLU(), nn.Linear(24, num_classes))
