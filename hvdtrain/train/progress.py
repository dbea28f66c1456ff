"""Where training stands: checkpoints and elastic commits save exactly this.

One record, not a piece in each component: Horovod's elastic state commits and restores it as one object (a
reference swap, train/loop_run.py), so position, steps, best and metric sums always roll back together; and the
checkpoint file keeps it under one key, "progress" (with the metric sums apart, per rank: MetricSums).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from hvdtrain.errors import UserError


@dataclass
class Progress:
    epoch: int = 0
    position: int = 0           # samples of this epoch's order processed by all ranks together
    step: int = 0               # optimizer steps since the run began (skipped ones included)
    fit_step: int = 0           # steps in the current fit() call; drives the LR schedule
    nonfinite: int = 0          # consecutive steps skipped for non-finite gradients
    skipped: int = 0            # all steps skipped for non-finite gradients
    # This rank's metric sums for the epoch (layout: train.metrics.MetricSet). Replaced, never changed
    # in place: an elastic commit keeps a reference to the committed value.
    stats: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    best: float = math.nan      # best value of config.monitor so far
    best_epoch: int = -1        # the epoch (0-based) that reached it; best.pt holds its weights
    branch: int = 0             # checkpoints' line of descent: a rollback starts the next (checkpoint/format.py)
    # A stream's changes of workers in this epoch, (position, workers before): data/stream_layout.py
    resplits: list[tuple[int, int]] = field(default_factory=list)

    def values(self, *, stats: bool = True) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if stats or f.name != "stats"}

    def state_dict(self) -> dict[str, Any]:
        """Stateful (checkpoint/stateful.py): every field but this rank's metric sums (MetricSums saves those)."""
        return self.values(stats=False)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, value in state.items():   # a field an older file lacks keeps its default
            setattr(self, name, value)

    def copy(self) -> Progress:
        return dataclasses.replace(self)

    def check_work_left(self, end_epoch: int, max_steps: int) -> None:
        """A one-line UserError when a resumed run has nothing left to train up to `end_epoch` (or max_steps)."""
        if (not self.position and self.epoch >= end_epoch) or (max_steps and self.step >= max_steps):
            raise UserError(f"nothing to do: the run already finished {self.epoch} of {end_epoch} epochs "
                            f"({self.step} steps); raise --epochs (or --max-steps) to train longer")


class MetricSums:
    """Stateful per rank (checkpoint/stateful.py): this rank's metric sums of the epoch so far, kept in the progress
    (they roll back with it on an elastic reset)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def state_dict(self) -> torch.Tensor:
        return self.progress.stats

    def load_state_dict(self, state: torch.Tensor) -> None:
        self.progress.stats = state

    def load_resized(self, states: list[torch.Tensor], rank: int) -> None:
        # Sums are what metrics need; keep them once, on rank 0 (the others: zeros in the run's own layout).
        self.progress.stats = sum(states[1:], states[0]) if rank == 0 else torch.zeros_like(states[0])
