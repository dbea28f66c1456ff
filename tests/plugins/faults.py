"""Test plug-ins that misbehave on purpose: slow steps, a rank that raises, NaN samples.

Used by the fault-tolerance tests through --model/--dataset import paths (tests/plugins on PYTHONPATH).
Knobs come from environment variables so one file serves every test.
"""
import os
import time

import torch
from torch import nn

from hvdtrain.data.datasets import digits
from hvdtrain.models.builtin import mlp


class _Slow(nn.Module):
    """Sleeps in forward so a test can act mid-epoch; the math is the plain MLP's.

    FAULTS_HOLD_FILE=PATH: after FAULTS_HOLD_AFTER training steps (default 4), steps wait while PATH exists,
    so a test acts at a known point however slowly the machine runs, then removes PATH to let training go on.
    """

    def __init__(self, inner: nn.Module, seconds: float) -> None:
        super().__init__()
        self.inner, self.seconds, self.calls = inner, seconds, 0
        self.hold = os.environ.get("FAULTS_HOLD_FILE", "")
        self.hold_after = int(os.environ.get("FAULTS_HOLD_AFTER", "4"))

    def state_dict(self, *args, **kwargs):
        """FAULTS_SAVE_SLEEP_S=N: once a stop signal was noted (the stop checkpoint), taking the weights for the
        checkpoint lasts N s longer, like a large model written to slow storage."""
        from hvdtrain.train.signals import STOP

        if STOP.signum:
            time.sleep(float(os.environ.get("FAULTS_SAVE_SLEEP_S", "0")))
        return super().state_dict(*args, **kwargs)

    def forward(self, x):
        time.sleep(self.seconds)
        if self.training and self.hold:
            self.calls += 1
            while self.calls > self.hold_after and os.path.exists(self.hold):
                time.sleep(0.1)
        return self.inner(x)


def slow_mlp(config, input_shape, num_classes):
    return _Slow(mlp(config, input_shape, num_classes), float(os.environ.get("FAULTS_SLEEP_S", "0.05")))


class _RaiseAt(nn.Module):
    def __init__(self, inner: nn.Module, rank: int, step: int) -> None:
        super().__init__()
        self.inner, self.rank, self.step, self.calls = inner, rank, step, 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == self.step and int(os.environ.get("HOROVOD_RANK", os.environ.get(
                    "OMPI_COMM_WORLD_RANK", "0"))) == self.rank:
                raise RuntimeError(f"planted failure at step {self.step}")
        return self.inner(x)


def raising_mlp(config, input_shape, num_classes):
    return _RaiseAt(mlp(config, input_shape, num_classes), int(os.environ["FAULTS_RANK"]),
                    int(os.environ["FAULTS_STEP"]))


def digits_with_nan(config):
    """The digits data with a few NaN images: the steps that meet them must be skipped, not applied."""
    data = digits(config)
    inputs = data.train.tensors[0].clone()
    inputs[:: int(os.environ.get("FAULTS_NAN_EVERY", "300"))] = float("nan")
    return type(data)(torch.utils.data.TensorDataset(inputs, data.train.tensors[1]), data.val, data.num_classes)
