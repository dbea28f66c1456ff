"""Before: a plain training loop on one process, no Horovod (docs/migrating.md turns it into train_own_loop.py).

    python train_plain.py
"""
import torch
from data import make_data
from torch import nn
from torch.utils.data import DataLoader

dataset = make_data(2048, 0)
loader = DataLoader(dataset, batch_size=32, shuffle=True)
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for epoch in range(3):
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
    torch.save(model.state_dict(), "model.pt")
