"""The learning rate of each step: the user's one-worker LRs, scaled for the number of workers (with warmup), on
hvdtrain's own decay (--lr-decay) or on the user's torch scheduler (`Trainer(lr_scheduler=...)`)."""
from __future__ import annotations

import warnings
from typing import Any

import torch

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.errors import UserError
from hvdtrain.train.lr_schedule import lr_at, set_lrs

SchedulerArg = Any   # a torch.optim.lr_scheduler.LRScheduler, or a factory: optimizer -> one
INTERVALS = ("step", "epoch")
DEFAULT_DECAY = TrainConfig.lr_decay


class LearningRate:
    """Args:
        optimizer: Horovod's DistributedOptimizer (it shares its param groups with the optimizer it wraps).
        original: the optimizer the user built (a scheduler may have been built on it); None: built by hvdtrain.
        decay: --lr-decay; warmup_epochs: --warmup-epochs.
        scheduler: the user's scheduler or a factory taking the optimizer; interval: "step" (after every
            optimizer step) or "epoch" (after every finished epoch).

    With a scheduler, the param groups hold its one-worker LRs between steps (what it reads, saves and restores);
    each step runs with them times the workers' scale (and warmup), then they are put back before it steps.
    """

    def __init__(self, optimizer: Any, original: Any, *, decay: str, warmup_epochs: float,
                 scheduler: SchedulerArg | None = None, interval: str = "step") -> None:
        self.optimizer, self.decay, self.warmup_epochs = optimizer, decay, warmup_epochs
        # One-worker LRs as the user built them; a resumed optimizer state carries the scheduled ones.
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]
        if interval not in INTERVALS:
            raise UserError(f"lr_scheduler_interval={interval!r}: use 'step' or 'epoch'")
        self.interval = interval
        self.scheduler = _scheduler(scheduler, optimizer, original) if scheduler is not None else None
        if self.scheduler is not None:   # it replaces the default decay; one asked for is a contradiction
            if decay not in ("none", DEFAULT_DECAY):
                raise UserError(f"lr_scheduler= and --lr-decay {decay} both schedule the LR: drop one")
            self.decay = "none"
        self.scale, self.steps_per_epoch = 1.0, 1
        self.unscaled: list[float] = []
        self.applied = self.base_lrs[0]

    def resize(self, scale: float, steps_per_epoch: int) -> None:
        """The workers' LR factor (train/lr_schedule.py scaled_lr) and the epoch's steps, after every (re)size."""
        self.scale, self.steps_per_epoch = scale, steps_per_epoch

    def start_step(self, fit_step: int, total_steps: int) -> None:
        """Set this step's LRs, before its first micro-batch."""
        warmup_steps = round(self.warmup_epochs * self.steps_per_epoch)
        factor = lr_at(fit_step, 1.0, self.scale, warmup_steps, total_steps, self.decay)
        if self.scheduler is None:
            set_lrs(self.optimizer, self.base_lrs, factor)
        else:
            self.unscaled = [group["lr"] for group in self.optimizer.param_groups]
            set_lrs(self.optimizer, self.unscaled, factor)
        self.applied = self.optimizer.param_groups[0]["lr"]

    def end_step(self) -> None:
        """After the optimizer step (applied or skipped): the scheduler's own LRs back, and its step."""
        if self.scheduler is None:
            return
        set_lrs(self.optimizer, self.unscaled, 1.0)
        if self.interval == "step":
            self._step()

    def end_epoch(self, record: dict[str, Any], monitor: str) -> None:
        """After a finished epoch: a per-epoch scheduler steps (ReduceLROnPlateau on --monitor, else val_loss)."""
        if self.scheduler is not None and self.interval == "epoch":
            if isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                self._step(record.get(monitor or "val_loss", record.get("train_loss")))
            else:
                self._step()

    def _step(self, *metric: Any) -> None:
        with warnings.catch_warnings():
            # torch checks the order of the two step() calls on the optimizer the scheduler was built on, which
            # Horovod's wrapper replaced: this loop steps the optimizer first, unseen by that check.
            warnings.filterwarnings("ignore", message=".*`optimizer.step\\(\\)`", category=UserWarning)
            assert self.scheduler is not None
            self.scheduler.step(*metric)

    def state_dict(self) -> dict[str, Any] | None:
        """Stateful (checkpoint/stateful.py): the scheduler's state (None without one)."""
        return self.scheduler.state_dict() if self.scheduler is not None else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.scheduler is not None and state is not None:
            self.scheduler.load_state_dict(state)


def _scheduler(given: SchedulerArg, optimizer: Any, original: Any) -> Any:
    """The user's scheduler, checked to drive this optimizer's param groups (a factory is called with it)."""
    if callable(given) and not hasattr(given, "step"):
        given = given(optimizer)
    if not (hasattr(given, "step") and hasattr(given, "state_dict") and hasattr(given, "optimizer")):
        raise UserError(f"lr_scheduler={given!r}: give a torch.optim.lr_scheduler scheduler, or a function that "
                        "takes the optimizer and returns one")
    if given.optimizer is not optimizer and given.optimizer is not original:
        raise UserError("lr_scheduler was built on another optimizer than the Trainer's: pass that optimizer as "
                        "optimizer=, or give a factory (lambda optimizer: OneCycleLR(optimizer, ...))")
    # Horovod's wrapper shares the user's param groups until a resumed state replaces them with its own: the
    # scheduler must set the wrapper's (a resume that left it on the old ones trained with a frozen LR).
    given.optimizer = optimizer
    return given
