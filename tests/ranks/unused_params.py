"""Rank-side: a layer used by some ranks and not others in a step, with gradients in buckets and per tensor.

    python tests/ranks/unused_params.py OUT.pt

Steps: every rank uses the middle layer; rank 1 skips it; every rank skips it; rank 0 skips it (a branch chosen
by the data, as in LayerDrop or mixture-of-experts routing). Rank 0 saves each setting's weights.
"""
from __future__ import annotations

import sys

import torch
from torch import nn

from hvdtrain.distributed import collectives, gradients, runtime

SKIPS = [set(), {1}, {0, 1}, {0}]   # per step: the ranks that skip the middle layer


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.middle, self.last = nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 10)
        self.skip = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.first(x))
        return self.last(x if self.skip else torch.relu(self.middle(x)))


def train(bucket_mb: float) -> dict[str, torch.Tensor]:
    net = Branchy()
    optimizer = gradients.wrap_optimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), net,
                                         bucket_mb=bucket_mb)
    collectives.broadcast_state(net, optimizer)
    generator = torch.Generator().manual_seed(world.rank)
    for skipping in SKIPS:
        net.skip = world.rank in skipping
        inputs, targets = torch.randn(16, 32, generator=generator), torch.randint(0, 10, (16,), generator=generator)
        nn.functional.cross_entropy(net(inputs), targets).backward()
        gradients.synchronize_gradients(optimizer)
        with optimizer.skip_synchronize():
            optimizer.step()
        optimizer.zero_grad()
    return {name: value.clone() for name, value in net.state_dict().items()}


world = runtime.init()
torch.set_num_threads(1)
found = {bucket_mb: train(bucket_mb) for bucket_mb in (0.0, 25.0, 0.001)}
if world.is_root:
    torch.save({"found": found, "buckets": {mb: len(gradients.buckets(Branchy().parameters(), mb))
                                            for mb in (25.0, 0.001)}}, sys.argv[1])
runtime.shutdown()
