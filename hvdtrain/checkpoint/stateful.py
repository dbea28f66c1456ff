"""Stateful components: what the checkpointer saves and restores, without knowing what any of them holds.

As torchtitan's CheckpointManager saves every `Stateful` it is handed: each component turns its own state into
plain values and tensors (`state_dict`; torch.load(weights_only=True) must read them back) and takes such a state
back (`load_state_dict`). The checkpoint file keeps one key per component, under the names given here (the file
format: checkpoint/format.py), so a name is never changed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class Stateful(Protocol):
    def state_dict(self) -> Any:
        """This component's state; None when it has none to save (its key is then left out of the file)."""

    def load_state_dict(self, state: Any) -> None:
        """Take back a state `state_dict` returned (None: the file has none, e.g. written without fp16)."""


class RankStateful(Stateful, Protocol):
    """State each rank holds for itself (its random streams, its metric sums): the file keeps a list, one per rank."""

    def load_resized(self, states: list[Any], rank: int) -> None:
        """Take this rank's share of `states`, written by another number of workers (len(states))."""


@dataclass(frozen=True)
class TrainingState:
    """Where training stands, by file key, in the order it is loaded: `shared` is the same on every rank (rank 0
    writes its own), `per_rank` is gathered from every rank. The model and the optimizer are not here: rank 0
    loads them and Horovod broadcasts them (checkpoint/manager.py)."""

    shared: dict[str, Stateful]
    per_rank: dict[str, RankStateful]
