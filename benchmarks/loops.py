"""What a benchmark variant trains: the trainer's config for a workload, the model with its data and
this rank's shard loader, and the hand-written step loop every non-hvdtrain variant shares.

Used by benchmarks/worker.py (one rank of benchmarks.run), benchmarks/overhead.py and
benchmarks/tracking_overhead.py; the workloads themselves (models, synthetic data, sizes) are
benchmarks/workloads.py.
"""
from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Subset

from benchmarks.workloads import config_values, is_tokens, narrow_resnet, token_step, token_workload
from hvdtrain.config.train_config import TrainConfig, load_config
from hvdtrain.data.datasets import build_data
from hvdtrain.models.builtin import build_model
from hvdtrain.models.zoo import resnet18


def bench_config(model: str, steps: int, size: int, smoke: bool, threads: int,
                 extra: list[str] | None = None, device: str = "cpu", precision: str = "fp32") -> TrainConfig:
    """The trainer's config for a workload: enough samples that every timed step lies in epoch one."""
    spec = config_values(model, smoke)
    samples = (steps + 2) * int(spec["batch_size"]) * size * 2
    values = {**spec, "dataset": "synthetic", "synthetic_samples": samples, "val_fraction": 0.05,
              "max_steps": steps, "threads": threads, "run_dir": "", "lr_scaling": "none", "warmup_epochs": 0,
              "lr_decay": "none", "lr": 0.01, "device": device, "precision": precision}
    return load_config(None, [f"--{k.replace('_', '-')}={v}" for k, v in values.items()] + (extra or []))


def to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, dict):
        return {key: value.to(device, non_blocking=True) for key, value in batch.items()}
    return [value.to(device, non_blocking=True) for value in batch]


def batch_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    if isinstance(batch, dict):
        return token_step(model, batch)
    inputs, targets = batch
    return nn.functional.cross_entropy(model(inputs), targets)


def plain_loop(model: nn.Module, optimizer: Any, loader: DataLoader, steps: int, device: torch.device,
               precision: str = "fp32", horovod: bool = False) -> None:
    """The hand-written step every loop variant shares: what a user would write.

    precision bf16/fp16: autocast forward and loss; fp16 adds a GradScaler (with Horovod, the
    documented order: synchronize, unscale, then step without a second synchronize)."""
    from hvdtrain.train.precision import autocast, make_scaler

    scaler = make_scaler(precision, device)
    model.train()
    done = 0
    while done < steps:
        for batch in loader:
            optimizer.zero_grad()
            with autocast(precision, device):
                loss = batch_loss(model, to(batch, device))
            if scaler is None:
                loss.backward()
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                if horovod:
                    optimizer.synchronize()
                scaler.unscale_(optimizer)
                if horovod:
                    with optimizer.skip_synchronize():
                        scaler.step(optimizer)
                else:
                    scaler.step(optimizer)
                scaler.update()
            done += 1
            if done >= steps:
                return


def workload(args: argparse.Namespace, config: TrainConfig, rank: int, size: int) -> dict[str, Any]:
    """The model, full train/val data, this rank's shard loader and (dict batches) hvdtrain's step_fn."""
    if is_tokens(args.model):
        model, train, val = token_workload(args.model, args.smoke, config.synthetic_samples, config.seed)
        step_fn: Any = token_step
    else:
        data = build_data(config)
        train, val, step_fn = data.train, data.val, None
        width = narrow_resnet(args.model, args.smoke)
        model = (build_model(config, tuple(data.train[0][0].shape), data.num_classes) if width is None
                 else resnet18(data.train[0][0].shape[0], data.num_classes, width=width))
    shard = Subset(train, range(rank, len(train), size))
    return {"model": model, "train": train, "val": val, "step_fn": step_fn,
            "loader": DataLoader(shard, batch_size=config.batch_size, pin_memory=args.device == "cuda")}
