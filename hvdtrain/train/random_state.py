"""This rank's random streams as a stateful component (train/stateful.py), saved per rank in checkpoints."""
from __future__ import annotations

from typing import Any

import torch

from hvdtrain.train.checkpoint import rng_state, set_rng_state


class RandomState:
    """torch's, numpy's, Python's (and CUDA's) generators and, given one, the training loader's generator, which
    draws its workers' seeds each epoch (data/loader.py).

    Args:
        loader: the training loader's generator; None saves and restores the process's generators only.
    """

    def __init__(self, loader: torch.Generator | None = None) -> None:
        self.loader = loader
        self.marked = loader.get_state() if loader is not None else None

    def mark(self) -> None:
        """Where a resume restarts the loader's generator: called as an epoch begins (before iter() draws the
        epoch's seed) and as one ends. Mid-epoch a resume thus draws this epoch's seed again, as the run that
        never stopped did, not the next epoch's."""
        if self.loader is not None:
            self.marked = self.loader.get_state()

    def state_dict(self) -> dict[str, Any]:
        return rng_state(self.marked)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_rng_state(state, self.loader)

    def load_resized(self, states: list[dict[str, Any]], rank: int) -> None:
        # Not the loader's: its state belongs to one rank's stream of worker seeds (see data/loader.py).
        set_rng_state(states[rank % len(states)])
