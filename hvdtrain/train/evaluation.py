"""Evaluation and prediction sharded across workers, and per-batch statistics (no host syncs)."""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Subset

from hvdtrain.data.datasets import eval_shard
from hvdtrain.distributed import dist


def batch_stats(loss: torch.Tensor, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[loss sum, correct, count] for one batch; correct is NaN when targets are not class labels."""
    count = targets.shape[0]
    if outputs.dim() == 2 and not targets.is_floating_point() and targets.dim() == 1:
        correct = (outputs.argmax(1) == targets).sum().to(torch.float64)
    else:
        correct = torch.tensor(float("nan"), dtype=torch.float64, device=outputs.device)
    return torch.stack([loss.to(torch.float64) * count, correct,
                        torch.tensor(float(count), dtype=torch.float64, device=outputs.device)])


def ratio(numerator: torch.Tensor, count: torch.Tensor) -> float | None:
    value = (numerator / count).item()
    return None if value != value else value  # NaN: not a classification task


@torch.no_grad()
def evaluate(model: nn.Module, data: Any, loss_fn: Callable[..., torch.Tensor], world: dist.World,
             batch_size: int, device: torch.device) -> dict[str, Any]:
    """Loss and accuracy over all of `data`, each sample counted exactly once across ranks."""
    was_training = model.training
    model.eval()
    shard = Subset(data, eval_shard(len(data), world.rank, world.size))
    stats = torch.zeros(3, dtype=torch.float64, device=device)
    for inputs, targets in DataLoader(shard, batch_size=batch_size):
        inputs, targets = inputs.to(device), targets.to(device)
        outputs = model(inputs)
        stats += batch_stats(loss_fn(outputs, targets), outputs, targets)
    # Horovod: sums, not averages, so unequal shards weigh correctly.
    total = dist.allreduce_sum(stats.cpu(), name="eval_stats")
    model.train(was_training)
    return {"val_loss": ratio(total[0], total[2]), "val_acc": ratio(total[1], total[2]),
            "val_samples": int(total[2].item())}


@torch.no_grad()
def predict(model: nn.Module, data: Any, world: dist.World, batch_size: int,
            device: torch.device) -> torch.Tensor:
    """Outputs for every sample of `data` in its original order, on every rank."""
    was_training = model.training
    model.eval()
    indices = eval_shard(len(data), world.rank, world.size)
    chunks = [model(inputs.to(device)).cpu()
              for inputs, _ in DataLoader(Subset(data, indices), batch_size=batch_size)]
    local = torch.cat(chunks) if chunks else torch.empty(0)
    model.train(was_training)
    # Horovod: shards differ in length, so gather as objects; rank r holds samples r, r+size, ...
    shards = dist.allgather_object(local, name="predict")
    out = torch.empty(len(data), *shards[0].shape[1:], dtype=shards[0].dtype)
    for rank, shard in enumerate(shards):
        out[rank::world.size] = shard
    return out


def param_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]
