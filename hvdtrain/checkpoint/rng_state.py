"""This rank's random streams: their state as plain values and tensors (rng_state / set_rng_state, what a checkpoint
file keeps under "rng", one per rank), and RandomState, the stateful component (checkpoint/stateful.py) that saves
and restores them."""
from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch


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


def rng_state(loader: torch.Tensor | None = None) -> dict[str, Any]:
    """This process's random number generators, as tensors and plain values; with `loader`, the state of
    the training loader's generator (it draws its workers' seeds each epoch) to restore on resume."""
    _, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    assert not isinstance(keys, str)  # the legacy form is a tuple with an array of keys
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                             "numpy": [torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached]}
    if torch.cuda.is_initialized():    # only a process that used CUDA has its RNG (--device cpu never starts it)
        state["cuda"] = torch.cuda.get_rng_state()
    if loader is not None:
        state["loader"] = loader
    return state


def set_rng_state(state: dict[str, Any], loader: torch.Generator | None = None) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(state["cuda"])
    if loader is not None and "loader" in state:
        loader.set_state(state["loader"])


@contextmanager
def rng_preserved() -> Iterator[None]:
    """Run something (e.g. a probe step) without moving this process's random number generators."""
    saved = rng_state()
    try:
        yield
    finally:
        set_rng_state(saved)
