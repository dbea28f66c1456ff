"""After: the same training with hvdtrain (docs/migrating.md shows the diffs from both "befores").

    horovodrun -np 2 -H localhost:2 python train_hvdtrain.py
"""
import sys

import torch
from data import make_data
from torch import nn
from torch.utils.data import DataLoader

import hvdtrain

dataset = make_data(2048, 0)
loader = DataLoader(dataset, batch_size=32, shuffle=True)
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
config = hvdtrain.load_config(None, ["--epochs", "3", *sys.argv[1:]])
trainer = hvdtrain.Trainer(model, loader, optimizer=optimizer, config=config,
                           loss_fn=nn.functional.cross_entropy)
trainer.fit()
