"""The training loop: read it top to bottom. Lines that exist only for distribution say `# Horovod:`."""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from hvdtrain import dist
from hvdtrain.config import TrainConfig, to_yaml
from hvdtrain.data import build_data, check_fits, steps_per_epoch
from hvdtrain.evaluation import batch_stats, evaluate, param_digest, predict, ratio
from hvdtrain.history import History
from hvdtrain.models import build_model
from hvdtrain.runlog import RunLog, open_run_dir
from hvdtrain.schedule import lr_at, scaled_lr


def pick_device(choice: str, local_rank: int) -> torch.device:
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        from hvdtrain.errors import UserError

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


def show_progress() -> bool:
    """A bar only where someone watches: a terminal or a notebook, never a log file."""
    return sys.stderr.isatty() or "ipykernel" in sys.modules


class Trainer:
    """Data-parallel training of any model on any map-style dataset, on every Horovod worker.

    Args:
        model: the model; its initial weights are taken from rank 0.
        train_data: a torch Dataset of (input, target) pairs with __len__.
        val_data: optional held-out Dataset, evaluated after every epoch.
        optimizer: optional optimizer over `model`'s parameters; default from `config`. Its learning
            rates are the one-worker rates, scaled by `config.lr_scaling`.
        loss_fn: `loss_fn(outputs, targets)`, mean over the batch; default cross-entropy.
        config: a TrainConfig (batch size, epochs, LR policy, run directory...); default TrainConfig().
    Example:
        >>> trainer = hvdtrain.Trainer(my_model, train_ds, val_ds, config=hvdtrain.load_config(epochs=5))
        >>> history = trainer.fit()
        >>> trainer.evaluate()["val_acc"], trainer.predict(val_ds).shape
    """

    def __init__(self, model: nn.Module, train_data: Any, val_data: Any = None, *,
                 optimizer: torch.optim.Optimizer | None = None,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 config: TrainConfig | None = None) -> None:
        self.config = config = config or TrainConfig()
        self.world = world = dist.init()
        # Each worker gets its share of this host's cores; oversubscription makes every rank slower.
        torch.set_num_threads(config.threads or max(1, (os.cpu_count() or 1) // world.local_size))
        self.device = pick_device(config.device, world.local_rank)
        check_fits(len(train_data), world.size)
        self.train_data, self.val_data = train_data, val_data
        self.model = model.to(self.device)
        self.loss_fn = loss_fn or nn.functional.cross_entropy
        optimizer = optimizer or make_optimizer(config, self.model)
        dist.broadcast_state(self.model, optimizer)        # Horovod: identical start everywhere
        self.optimizer = dist.wrap_optimizer(optimizer, self.model)
        self.base_lrs = [group["lr"] for group in self.optimizer.param_groups]
        # Horovod: explicit rank/size; each epoch reshuffles with seed + epoch, the same on all ranks.
        self.sampler: DistributedSampler = DistributedSampler(
            train_data, num_replicas=world.size, rank=world.rank, shuffle=True, seed=config.seed)
        self.loader = DataLoader(train_data, batch_size=config.batch_size, sampler=self.sampler,
                                 pin_memory=self.device.type == "cuda")
        self.steps_per_epoch = steps_per_epoch(len(train_data), world.size, config.batch_size)
        self.lr_scale = scaled_lr(1.0, world.size, config.lr_scaling)
        self.epoch = 0
        self.step = 0
        self.history = History()
        self.log: RunLog | None = None
        self._run_path: str | None = None

    def fit(self, epochs: int | None = None) -> History:
        """Train for `epochs` (default config.epochs) more epochs; the LR schedule restarts per call.

        Returns:
            The History of every epoch so far (rank 0's metrics, the same on every rank).
        """
        config, world = self.config, self.world
        epochs = epochs or config.epochs
        if self._run_path is None:
            self._run_path, self.log = open_run_dir(config, world.is_root)
        if self.log:
            print(f"hvdtrain: {world.size} worker(s), {len(self.train_data)} train / "
                  f"{len(self.val_data) if self.val_data is not None else 0} held-out samples, LR x"
                  f"{self.lr_scale:g} ({config.lr_scaling}), run dir {self.log.path}\n{to_yaml(config)}",
                  flush=True)
        total_steps = min(epochs * self.steps_per_epoch, config.max_steps or epochs * self.steps_per_epoch)
        warmup_steps = round(config.warmup_epochs * self.steps_per_epoch)
        bar = None
        if world.is_root and show_progress():
            from tqdm.auto import tqdm

            bar = tqdm(total=total_steps, unit="step", leave=False)

        fit_step, samples_seen, lr_factor = 0, 0, 1.0
        fit_start = time.perf_counter()
        self.model.train()
        for _ in range(epochs):
            self.sampler.set_epoch(self.epoch)              # Horovod: a new shuffle of every shard
            epoch_start = time.perf_counter()
            stats = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss sum, correct, count
            for inputs, targets in self.loader:
                lr_factor = lr_at(fit_step, 1.0, self.lr_scale, warmup_steps, total_steps, config.lr_decay)
                for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
                    group["lr"] = base_lr * lr_factor
                inputs = inputs.to(self.device, non_blocking=True)
                targets = targets.to(self.device, non_blocking=True)
                self.optimizer.zero_grad()  # torch 2.x sets grads to None (Horovod's wrapper takes no args)
                outputs = self.model(inputs)
                loss = self.loss_fn(outputs, targets)
                loss.backward()                             # Horovod: allreduces start here
                self.optimizer.step()                       # Horovod: waits for them
                stats += batch_stats(loss.detach(), outputs.detach(), targets)  # no .item(): no host sync
                self.step += 1
                fit_step += 1
                if bar:
                    bar.update()
                if self.step % config.log_interval == 0:
                    # Horovod: one allreduce per log interval, not per step.
                    total = dist.allreduce_sum(stats.cpu(), name="train_stats")
                    record = {"kind": "train", "epoch": self.epoch, "step": self.step,
                              "lr": self.base_lrs[0] * lr_factor, "loss": (total[0] / total[2]).item(),
                              "acc": ratio(total[1], total[2])}
                    if self.log:
                        self.log.metrics(record)
                    if bar:
                        bar.set_postfix(loss=f"{record['loss']:.4f}", refresh=False)
                if fit_step >= total_steps:
                    break
            total = dist.allreduce_sum(stats.cpu(), name="train_stats")
            epoch_time = time.perf_counter() - epoch_start
            samples_seen += int(total[2].item())
            record = {"kind": "epoch", "epoch": self.epoch, "step": self.step,
                      "lr": self.base_lrs[0] * lr_factor, "train_loss": (total[0] / total[2]).item(),
                      "train_acc": ratio(total[1], total[2]),
                      **self.evaluate(), "samples_per_s": int(total[2].item()) / epoch_time,
                      "epoch_time_s": epoch_time}
            self.history.append(record)
            if self.log:
                self.log.epoch(record, bar)
            self.epoch += 1
            if fit_step >= total_steps:
                break
        if bar:
            bar.close()

        wall = time.perf_counter() - fit_start
        # Horovod: proof that every replica took the same steps and ended with the same weights.
        per_rank = dist.allgather_object((self.step, param_digest(self.model)), name="final_state")
        self.history.summary = {**self.history[-1], "kind": "summary", "epochs_run": len(self.history),
                                "steps": self.step, "workers": world.size,
                                "samples_per_s": samples_seen / wall, "wall_time_s": wall,
                                "rank_steps": [s for s, _ in per_rank],
                                "param_digests": [d for _, d in per_rank], "run_dir": self._run_path}
        if self.log:
            self.log.finish(self.history, self.model)
        return self.history

    def evaluate(self, data: Any = None) -> dict[str, Any]:
        """Loss and accuracy over `data` (default: the held-out set), each sample counted once."""
        data = self.val_data if data is None else data
        if data is None:
            return {}
        return evaluate(self.model, data, self.loss_fn, self.world, self.config.eval_batch_size, self.device)

    def predict(self, data: Any) -> torch.Tensor:
        """Model outputs for every sample of `data`, in order, on every rank (computed sharded)."""
        return predict(self.model, data, self.world, self.config.eval_batch_size, self.device)


def fit(config: TrainConfig) -> History:
    """Train the model and dataset named in `config` (built-ins or plug-ins) on every worker.

    Args:
        config: a TrainConfig, e.g. `hvdtrain.load_config("run.yaml", epochs=3)`.
    Returns:
        The History: per-epoch metrics, `.summary` (final metrics, throughput, run dir), `.plot()`.
    Example:
        >>> history = hvdtrain.fit(hvdtrain.load_config(model="mlp", epochs=5))
    """
    torch.manual_seed(config.seed)
    data = build_data(config)
    model = build_model(config, tuple(data.train[0][0].shape), data.num_classes)
    return Trainer(model, data.train, data.val, config=config).fit()
