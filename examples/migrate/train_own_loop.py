"""After, keeping your loop: train_plain.py (or train_horovod.py) with hvdtrain.prepare, and checkpoints that
resume where they stopped (docs/migrating.md shows both diffs).

    horovodrun -np 2 -H localhost:2 python train_own_loop.py
"""
import os

import torch
from data import make_data
from torch import nn
from torch.utils.data import DataLoader

import hvdtrain

dataset = make_data(2048, 0)
loader = DataLoader(dataset, batch_size=32, shuffle=True)
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
model, optimizer, loader = hvdtrain.prepare(model, optimizer, loader)
start = hvdtrain.load("ckpt.pt", model, optimizer, loader)["epoch"] if os.path.exists("ckpt.pt") else 0
for epoch in range(start, 3):
    loader.set_epoch(epoch)
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
    if hvdtrain.save("ckpt.pt", model, optimizer, loader, extra={"epoch": epoch + 1}):   # rank 0 writes
        print(f"epoch {epoch} loss {loss.item():.4f}")
