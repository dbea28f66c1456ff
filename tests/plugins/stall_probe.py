"""A model that stops making progress after a set number of training steps, so a test can kill the process at
a known point (`kill -9` after step N's record is logged and before any later checkpoint), never by a race.

HVDTRAIN_STALL_AFTER=N: the (N+1)-th training forward sleeps until the process is killed; unset, a plain MLP.
"""
import os
import time

from torch import nn

from hvdtrain.models.builtin import mlp


class _Stall(nn.Module):
    def __init__(self, inner: nn.Module, after: int) -> None:
        super().__init__()
        self.inner, self.after, self.calls = inner, after, 0

    def forward(self, x):
        if self.training and self.after:   # evaluation and the first-batch probe run in eval mode: not counted
            self.calls += 1
            while self.calls > self.after:
                time.sleep(1.0)
        return self.inner(x)


def stalling_mlp(config, input_shape, num_classes):
    return _Stall(mlp(config, input_shape, num_classes), int(os.environ.get("HVDTRAIN_STALL_AFTER", "0")))
