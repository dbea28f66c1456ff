"""Before: a hand-written Horovod loop (the shape of benchmarks/worker.py's `horovod` variant).

    horovodrun -np 2 -H localhost:2 python train_horovod.py
"""
import horovod.torch as hvd
import torch
from data import make_data
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

hvd.init()
dataset = make_data(2048, 0)
sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())
loader = DataLoader(dataset, batch_size=32, sampler=sampler)
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
for epoch in range(3):
    sampler.set_epoch(epoch)
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
    if hvd.rank() == 0:
        print(f"epoch {epoch} loss {loss.item():.4f}")
        torch.save(model.state_dict(), "model.pt")
