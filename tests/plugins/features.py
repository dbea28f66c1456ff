"""Test plug-ins for the training-feature tests: a BatchNorm model, and a model that stalls one rank.

Used through --model import paths (tests/plugins on PYTHONPATH); knobs come from environment variables.
"""
import math
import os
import time

from torch import nn


def bn_mlp(config, input_shape, num_classes):
    """The built-in MLP's shape with a BatchNorm after each hidden layer (running stats to compare)."""
    width = config.hidden
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(input_shape), width), nn.BatchNorm1d(width), nn.ReLU(),
        nn.Linear(width, width), nn.BatchNorm1d(width), nn.ReLU(),
        nn.Linear(width, num_classes),
    )


class _StallOnce(nn.Module):
    """One rank sleeps once in a training forward, so the others wait in the allreduce (a stall)."""

    def __init__(self, inner: nn.Module, rank: int, step: int, seconds: float) -> None:
        super().__init__()
        self.inner, self.rank, self.step, self.seconds, self.calls = inner, rank, step, seconds, 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            rank = os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
            if self.calls == self.step and int(rank) == self.rank:
                time.sleep(self.seconds)
        return self.inner(x)


def stall_mlp(config, input_shape, num_classes):
    from hvdtrain.models.builtin import mlp

    return _StallOnce(mlp(config, input_shape, num_classes), int(os.environ.get("FEATURES_STALL_RANK", "1")),
                      int(os.environ.get("FEATURES_STALL_STEP", "3")), float(os.environ.get("FEATURES_STALL_S", "4")))
