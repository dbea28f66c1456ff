"""Your own model and data, trained with hvdtrain: the quickstart's script (docs/quickstart.md).

    python train.py                                   # one worker
    horovodrun -np 2 -H localhost:2 python train.py   # two workers on this machine
    hvdtrain launch -np 4 -H a:2,b:2 python train.py  # four workers on hosts a and b

`--key value` pairs override the config (e.g. `--epochs 5`). No Horovod call here: the Trainer
initialises Horovod, shards the data, averages gradients and writes runs/ from rank 0 only.
"""
import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

import hvdtrain


def make_data(n: int, seed: int) -> TensorDataset:
    """Two noisy classes in 20 dimensions: your Dataset goes here."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    return TensorDataset(x, (x[:, :5].sum(dim=1) > 0).long())


model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))   # your model goes here
config = hvdtrain.load_config(None, ["--epochs", "3", *sys.argv[1:]])   # defaults, then your --key value
trainer = hvdtrain.Trainer(model, make_data(2048, 0), make_data(512, 1), config=config,
                           loss_fn=nn.functional.cross_entropy)
trainer.fit()   # rank 0 prints one line per epoch and writes runs/<name>/
