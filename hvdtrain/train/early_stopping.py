"""Best weights and early stopping on --monitor: a callback (train/callbacks.py) on the loop's epoch ends, and the
pure functions it decides by."""
from __future__ import annotations

import math
from typing import Any

from hvdtrain.distributed import collectives


def improved(best: float, value: float | None, higher_is_better: bool) -> bool:
    """Strictly better than `best` (NaN: nothing seen yet). A missing or NaN value never improves."""
    if value is None or math.isnan(value):
        return False
    if math.isnan(best):
        return True
    return value > best if higher_is_better else value < best


def patience_exhausted(epochs_done: int, best_epoch: int, patience: int) -> bool:
    """After `epochs_done` finished epochs, with the best at (0-based) epoch `best_epoch`: stop?"""
    return patience > 0 and best_epoch >= 0 and epochs_done - 1 - best_epoch >= patience


class Monitor:
    """--monitor: after each finished epoch, rank 0 judges the metric; a better value writes best.pt, and
    --patience epochs without one stop training. The best value and its epoch live in the trainer's Progress,
    so checkpoints and elastic commits keep them with the position they belong to.

    Args:
        metric: the record's key (val_acc, val_loss...); patience: epochs without improvement (0: never stop).
        higher_is_better: the metric's direction.
    """

    def __init__(self, metric: str, patience: int, higher_is_better: bool) -> None:
        self.metric, self.patience, self.higher_is_better = metric, patience, higher_is_better

    def on_epoch_end(self, trainer: Any, epoch: int, record: dict[str, Any]) -> bool:
        p = trainer.progress
        value = record.get(self.metric)
        verdict = (improved(p.best, value, self.higher_is_better), value) if trainer.world.is_root else None
        # Horovod: rank 0's verdict for all, so every rank holds the same best and stops at the same epoch.
        better, value = collectives.broadcast_object(verdict, name="monitor")
        if better:
            p.best, p.best_epoch = value, epoch
            if trainer.run.log:
                trainer.run.log.best(trainer.model)
        return patience_exhausted(epoch + 1, p.best_epoch, self.patience)
