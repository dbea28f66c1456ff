"""The training loop: read it top to bottom. Lines that exist only for distribution say `# Horovod:`."""
from __future__ import annotations

import hashlib
import os
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler

from hvdtrain import dist
from hvdtrain.config import TrainConfig, to_yaml
from hvdtrain.data import build_data, check_fits, eval_shard, steps_per_epoch
from hvdtrain.errors import UserError
from hvdtrain.models import build_model
from hvdtrain.runlog import RunLog, plan_run_dir
from hvdtrain.schedule import lr_at, scaled_lr


def pick_device(choice: str, local_rank: int) -> torch.device:
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError("device cuda was asked for but torch sees no CUDA device; use --device cpu")
    # Horovod: one GPU per worker, chosen by its rank on this host.
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


def make_optimizer(config: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    params = model.parameters()
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                               weight_decay=config.weight_decay)
    kind = torch.optim.Adam if config.optimizer == "adam" else torch.optim.AdamW
    return kind(params, lr=config.lr, weight_decay=config.weight_decay)


def param_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


@torch.no_grad()
def evaluate(model: nn.Module, val_data: Any, world: dist.World, batch_size: int,
             device: torch.device) -> dict[str, float]:
    """Loss and accuracy over the whole held-out set, each sample counted once across ranks."""
    model.eval()
    shard = Subset(val_data, eval_shard(len(val_data), world.rank, world.size))
    stats = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
    for inputs, targets in DataLoader(shard, batch_size=batch_size):
        inputs, targets = inputs.to(device), targets.to(device)
        logits = model(inputs)
        stats[0] += nn.functional.cross_entropy(logits, targets, reduction="sum")
        stats[1] += (logits.argmax(1) == targets).sum()
        stats[2] += len(targets)
    # Horovod: sums, not averages, so unequal shards weigh correctly.
    total = dist.allreduce_sum(stats.cpu(), name="eval_stats")
    model.train()
    return {"val_loss": (total[0] / total[2]).item(), "val_acc": (total[1] / total[2]).item(),
            "val_samples": int(total[2].item())}


def train(config: TrainConfig) -> dict[str, Any]:
    """Train with `config` on every worker horovodrun started (or just this process).

    Returns rank 0's summary (final metrics, throughput, run directory) on every rank.
    """
    world = dist.init()
    torch.manual_seed(config.seed)
    # Each worker gets its share of this host's cores; oversubscription makes every rank slower.
    torch.set_num_threads(config.threads or max(1, (os.cpu_count() or 1) // world.local_size))
    device = pick_device(config.device, world.local_rank)

    data = build_data(config)
    check_fits(len(data.train), world.size)
    input_shape = tuple(data.train[0][0].shape)
    model = build_model(config, input_shape, data.num_classes).to(device)
    optimizer = make_optimizer(config, model)
    dist.broadcast_state(model, optimizer)                 # Horovod: identical start everywhere
    optimizer = dist.wrap_optimizer(optimizer, model)

    # Horovod: explicit rank/size; each epoch reshuffles with seed + epoch, the same on all ranks.
    sampler: DistributedSampler = DistributedSampler(data.train, num_replicas=world.size, rank=world.rank,
                                 shuffle=True, seed=config.seed)
    loader = DataLoader(data.train, batch_size=config.batch_size, sampler=sampler,
                        pin_memory=device.type == "cuda")
    steps = steps_per_epoch(len(data.train), world.size, config.batch_size)
    target_lr = scaled_lr(config.lr, world.size, config.lr_scaling)
    warmup_steps = round(config.warmup_epochs * steps)
    total_steps = min(config.epochs * steps, config.max_steps or config.epochs * steps)

    # Rank 0 decides the run directory; every rank learns the verdict so none waits alone.
    plan = plan_run_dir(config) if world.is_root else None
    plan = dist.broadcast_object(plan, name="run_dir_plan")
    if plan["error"]:
        raise UserError(plan["error"])
    log = RunLog(plan["path"], config, world) if world.is_root else None
    if log:
        print(f"hvdtrain: {world.size} worker(s), {len(data.train)} train / {len(data.val)} "
              f"held-out samples, lr {config.lr} -> {target_lr:g} ({config.lr_scaling}), "
              f"run dir {log.path}\n{to_yaml(config)}", flush=True)

    step = 0
    samples_seen = 0
    history: list[dict[str, Any]] = []
    train_start = time.perf_counter()
    model.train()
    for epoch in range(config.epochs):
        sampler.set_epoch(epoch)                           # Horovod: a new shuffle of every shard
        epoch_start = time.perf_counter()
        stats = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
        for inputs, targets in loader:
            lr = lr_at(step, config.lr, target_lr, warmup_steps, total_steps, config.lr_decay)
            for group in optimizer.param_groups:
                group["lr"] = lr
            inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            optimizer.zero_grad()  # torch 2.x sets grads to None (Horovod's wrapper takes no args)
            logits = model(inputs)
            loss = nn.functional.cross_entropy(logits, targets)
            loss.backward()                                # Horovod: allreduces start here
            optimizer.step()                               # Horovod: waits for them
            # No .item() here: that would be a host sync every step.
            stats[0] += loss.detach() * len(targets)
            stats[1] += (logits.detach().argmax(1) == targets).sum()
            stats[2] += len(targets)
            step += 1
            if step % config.log_interval == 0:
                # Horovod: one allreduce per log interval, not per step.
                total = dist.allreduce_sum(stats.cpu(), name="train_stats")
                if log:
                    log.metrics({"kind": "train", "epoch": epoch, "step": step, "lr": lr,
                                 "loss": (total[0] / total[2]).item(),
                                 "acc": (total[1] / total[2]).item()})
            if config.max_steps and step >= config.max_steps:
                break
        total = dist.allreduce_sum(stats.cpu(), name="train_stats")
        epoch_time = time.perf_counter() - epoch_start
        global_samples = int(total[2].item())
        samples_seen += global_samples
        record = {"kind": "epoch", "epoch": epoch, "step": step, "lr": lr,
                  "train_loss": (total[0] / total[2]).item(), "train_acc": (total[1] / total[2]).item(),
                  **evaluate(model, data.val, world, config.eval_batch_size, device),
                  "samples_per_s": global_samples / epoch_time,
                  "epoch_time_s": epoch_time}
        history.append(record)
        if log:
            log.epoch(record, config.epochs)
        if config.max_steps and step >= config.max_steps:
            break

    wall = time.perf_counter() - train_start
    # Horovod: proof that every replica took the same steps and ended with the same weights.
    per_rank = dist.allgather_object((step, param_digest(model)), name="final_state")
    summary = {**history[-1], "kind": "summary", "epochs_run": len(history), "steps": step, "workers": world.size,
               "samples_per_s": samples_seen / wall, "wall_time_s": wall,
               "rank_steps": [s for s, _ in per_rank], "param_digests": [d for _, d in per_rank],
               "run_dir": plan["path"]}
    if log:
        log.finish(summary, model)
    return summary
