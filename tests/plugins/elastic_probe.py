"""Test plug-ins for elastic runs: digits whose last input column is the sample's index, and an MLP
that logs which samples each training step saw.

The step counter is a model buffer, so Horovod's elastic restore rolls it back with the weights:
a log line whose counter repeats an earlier one is a step redone after a failure, and the last line
for each counter value is the step that really counted.
"""
import json
import os
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

from hvdtrain.data.datasets import Data, digits
from hvdtrain.models.builtin import mlp

HOLD_SLEEP_S = 0.5


def indexed_digits(config):
    data = digits(config)
    inputs = data.train.tensors[0].flatten(1)
    index = torch.arange(len(inputs), dtype=torch.float32).unsqueeze(1)
    val_inputs = data.val.tensors[0].flatten(1)
    val = torch.cat([val_inputs, torch.full((len(val_inputs), 1), -1.0)], dim=1)
    return Data(TensorDataset(torch.cat([inputs, index], dim=1), data.train.tensors[1]),
                TensorDataset(val, data.val.tensors[1]), data.num_classes)


class Probe(nn.Module):
    def __init__(self, inner: nn.Module, log: str, sleep: float, hold: str | None = None) -> None:
        super().__init__()
        self.inner, self.log, self.sleep, self.hold = inner, log, sleep, hold
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        if self.training:
            self.calls += 1
            # While the test's hold file exists, steps are slow, so the run outlasts the test's faults
            # however long the machine takes to re-admit a host; removing it lets the run finish.
            time.sleep(HOLD_SLEEP_S if self.hold and os.path.exists(self.hold) else self.sleep)
            with open(f"{self.log}.{os.getpid()}", "a") as handle:
                handle.write(json.dumps({"t": time.time(), "call": int(self.calls),
                                         "rank": os.environ.get("HOROVOD_RANK"),
                                         "idx": x[:, -1].long().tolist()}) + "\n")
        return self.inner(x[:, :-1])


def probe_mlp(config, input_shape, num_classes):
    inner = mlp(config, (input_shape[0] - 1,), num_classes)
    return Probe(inner, os.environ["ELASTIC_PROBE_LOG"], float(os.environ.get("ELASTIC_PROBE_SLEEP_S", "0.02")),
                 os.environ.get("ELASTIC_PROBE_HOLD"))
