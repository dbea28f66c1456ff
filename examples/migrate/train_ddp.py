"""Before: a DistributedDataParallel loop started by torchrun.

    torchrun --nproc_per_node 2 train_ddp.py
"""
import torch
import torch.distributed as dist
from data import make_data
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

dist.init_process_group("gloo")
dataset = make_data(2048, 0)
sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=32, sampler=sampler)
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
model = nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * dist.get_world_size(), momentum=0.9)
for epoch in range(3):
    sampler.set_epoch(epoch)
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
    if dist.get_rank() == 0:
        print(f"epoch {epoch} loss {loss.item():.4f}")
        torch.save(model.module.state_dict(), "model.pt")
dist.destroy_process_group()
