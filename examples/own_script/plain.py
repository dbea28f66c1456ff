"""train.py's model and data in a plain PyTorch loop: one process, no hvdtrain, no Horovod. The "before" of
docs/how-to/own-script.md, whose diff turns it into train.py.

    python plain.py
"""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_data(n: int, seed: int) -> TensorDataset:
    """Two noisy classes in 20 dimensions: your Dataset goes here."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    return TensorDataset(x, (x[:, :5].sum(dim=1) > 0).long())


model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))   # your model goes here
train, held_out = make_data(2048, 0), make_data(512, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for epoch in range(3):
    model.train()
    for inputs, targets in DataLoader(train, batch_size=32, shuffle=True):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        inputs, targets = held_out.tensors
        accuracy = (model(inputs).argmax(dim=1) == targets).float().mean().item()
    print(f"epoch {epoch + 1} val_acc {accuracy:.4f}")
torch.save(model.state_dict(), "model.pt")
