"""Early stopping and the best checkpoint: pure functions of the monitored metric."""
from __future__ import annotations

import math


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
