"""Rank-side: a plain training loop made data-parallel by hvdtrain.prepare (tests/multirank/test_own_loop_multirank.py).

    python tests/ranks/own_loop.py MODE CHECKPOINT

train: 3 epochs, batch BATCH per worker, with an hvdtrain.save after STOP_AT steps of epoch 1 (the run goes on
to the end); resume: a new job that hvdtrain.load-s that checkpoint and finishes from there. Where training
ends, every rank compares its weights with the reference, trained here without Horovod: one process, batch
2 x BATCH, the same order of samples (the one-worker shuffle, ShardSampler with size 1, is a plain permutation
seeded by seed + epoch). Averaged gradients of 2 workers of batch b are the gradient of one batch 2b at the same
LR: so lr_scaling="none" here.
Each rank's model starts from its own seed: prepare must broadcast rank 0's. Prints `own_loop OK` per rank.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hvdtrain
from hvdtrain.data.sharding import ShardSampler
from hvdtrain.environment.process import current

mode, ckpt = sys.argv[1], Path(sys.argv[2])
BATCH, EPOCHS, STOP_AT, SEED, LR = 4, 3, 3, 7, 0.05
TOLERANCE = 1e-5


def dataset() -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    inputs = torch.randn(60, 5, generator=gen, dtype=torch.float64)   # 60: the last batch is a short one
    return TensorDataset(inputs, inputs.sum(1, keepdim=True).sin())


def build(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor) -> None:
    optimizer.zero_grad()
    nn.functional.mse_loss(model(inputs), targets).backward()
    optimizer.step()


def reference() -> list[torch.Tensor]:
    """One process, no Horovod, batch 2 x BATCH, rank 0's initial weights."""
    model, optimizer = build(SEED)
    sampler = ShardSampler(len(dataset()), 0, 1, seed=SEED)
    loader = DataLoader(dataset(), batch_size=2 * BATCH, sampler=sampler)
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            step(model, optimizer, inputs, targets)
    return [p.detach() for p in model.parameters()]


model, optimizer = build(SEED + current().rank)    # the launcher's rank: Horovod starts in prepare
model, optimizer, loader = hvdtrain.prepare(model, optimizer, DataLoader(dataset(), batch_size=BATCH, shuffle=True),
                                            lr_scaling="none", seed=SEED)
first_epoch = hvdtrain.load(ckpt, model, optimizer, loader)["epoch"] if mode == "resume" else 0
for epoch in range(first_epoch, EPOCHS):
    loader.set_epoch(epoch)
    for index, (inputs, targets) in enumerate(loader):
        step(model, optimizer, inputs, targets)
        if mode == "train" and epoch == 1 and index + 1 == STOP_AT:
            hvdtrain.save(ckpt, model, optimizer, loader, extra={"epoch": epoch})
            print(f"own_loop saved at {loader.state_dict()}", flush=True)

expected = reference()
worst = max(float((got.detach() - want).abs().max()) for got, want in zip(model.parameters(), expected, strict=True))
assert worst < TOLERANCE, f"weights differ from one worker with twice the batch by {worst}"
print(f"own_loop OK (largest difference {worst:.2e})", flush=True)
