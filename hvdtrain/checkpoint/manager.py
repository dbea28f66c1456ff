"""The checkpoint manager (the Trainer's checkpointer): when a checkpoint is due, writing the stateful components it
is handed under their file keys (checkpoint/stateful.py; the keys are the file format, unchanged), and reading one
on rank 0 to resume. Built from its own settings section of the config."""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from hvdtrain.checkpoint import format as checkpoint
from hvdtrain.checkpoint.resume import apply_resume, read_on_root
from hvdtrain.checkpoint.stateful import Stateful, TrainingState
from hvdtrain.config.train_config import TrainConfig
from hvdtrain.data.fingerprint import fingerprint
from hvdtrain.data.shard_source import Resplits
from hvdtrain.distributed import collectives, runtime
from hvdtrain.output.plain_weights import PlainWeights
from hvdtrain.output.run_directory import RunDirectory


@dataclass(frozen=True)
class CheckpointSettings:
    """What the checkpointer reads of the config."""

    steps: int              # --checkpoint-steps (0: none mid-epoch)
    epochs: int             # --checkpoint-epochs
    keep: int               # --keep-checkpoints
    on_stop: bool           # --checkpoint-on-stop
    resume: str             # --resume: 'auto', a path, or ''
    changed_data: str       # --resume-changed-data
    record: dict[str, Any]  # the whole config: saved in the payload, compared with a checkpoint's on resume

    @classmethod
    def of(cls, config: TrainConfig) -> CheckpointSettings:
        return cls(config.checkpoint_steps, config.checkpoint_epochs, config.keep_checkpoints,
                   config.checkpoint_on_stop, config.resume, config.resume_changed_data, config.to_dict())


class EpochPosition(Protocol):
    """Where the epoch stands, as resuming needs it: the Trainer's Progress (train/progress.py), named by what
    this package reads of it, since the checkpoint package sits below train/."""

    position: int           # samples of this epoch's order processed by all ranks together
    resplits: Resplits      # how the epoch's rest was re-split where the workers changed


class Checkpointer:
    """Args:
        settings: CheckpointSettings.of(config).
        run: the run directory (checkpoints go under it; none without one).
        model, optimizer: saved (the model under its plain keys) and, on resume, loaded on rank 0, then
            broadcast by Horovod (the optimizer Horovod wrapped).
        data: (train, held-out) data, fingerprinted where a checkpoint is written or read.
        scheduled: a user's LR scheduler drives the optimizer's settings: a resume keeps the checkpoint's.

    Everything else a checkpoint holds comes from the components handed to each save and resume (a
    TrainingState, checkpoint/stateful.py): saved under their names, restored by name; this class knows none of them.
    """

    def __init__(self, settings: CheckpointSettings, run: RunDirectory, model: torch.nn.Module, optimizer: Any,
                 data: tuple[Any, Any], *, scheduled: bool = False) -> None:
        self.settings, self.run, self.data, self.scheduled = settings, run, data, scheduled
        self.weights: dict[str, Stateful] = {"model": PlainWeights(model), "optimizer": optimizer}

    @functools.cached_property
    def data_fingerprint(self) -> dict[str, Any]:
        """The data this run trains on; once, where a checkpoint is read or written (a stat of every image
        file: not on every rank)."""
        return fingerprint(*self.data)

    def due_at_step(self, step: int) -> bool:
        return bool(self.settings.steps) and step % self.settings.steps == 0

    def due_at_epoch(self, epoch: int) -> bool:
        return bool(self.settings.epochs) and epoch % self.settings.epochs == 0

    def read_on_root(self, run_path: str | None) -> dict[str, Any] | None:
        """Rank 0: with --resume, load the checkpoint's weights here and return what the other ranks need."""
        if not self.settings.resume:
            return None
        return read_on_root(self.settings.resume, self.settings.record, self.settings.changed_data, run_path,
                            self.weights, self.data_fingerprint, keep_saved_settings=self.scheduled)

    def adopt(self, found: dict[str, Any] | None, state: TrainingState, p: EpochPosition, world: runtime.World,
              resplit: Callable[[Resplits, int, int], Resplits]) -> str | None:
        """Every rank: its share of what rank 0 read, loaded into `state`'s components; the epoch's rest re-split
        by the shard source (`resplit`) where the workers changed; the line to show."""
        if found is None:
            return None
        resumed = apply_resume(found, state, world)
        if found.get("payload"):  # before the resume line claims anything
            p.resplits = resplit(p.resplits, p.position, found["payload"]["world_size"])
        return resumed

    def share_resume(self, run_path: str | None, *, is_root: bool) -> dict[str, Any] | None:
        """Every rank: what rank 0 read to resume (None without --resume)."""
        if not self.settings.resume:
            return None
        found = self.read_on_root(run_path) if is_root else None
        return collectives.broadcast_object(found, name="resume")   # Horovod: rank 0's reading for all

    def gather_and_save(self, state: TrainingState, step: int, *, is_root: bool) -> str | None:
        """A collective: every rank contributes its per-rank states; rank 0 writes."""
        if not self.run.path:
            return None
        gathered = collectives.allgather_object(own_states(state), name="checkpoint_gather")
        return self.save(state, step, gathered) if is_root else None

    def save(self, state: TrainingState, step: int, gathered: list[dict[str, Any]] | None = None, *,
             replace: bool = True) -> str | None:
        """Write as rank 0, with every rank's per-rank states (`gathered`, in rank order; None: this rank's own
        alone, a file that reads as a 1-worker run). replace=False (an elastic survivor): nothing where this
        step's checkpoint exists or is being written."""
        if not self.run.path:
            return None
        per_rank = gathered if gathered is not None else [own_states(state)]
        shared = {name: component.state_dict() for name, component in {**self.weights, **state.shared}.items()}
        payload = {**{name: value for name, value in shared.items() if value is not None}, "world_size": len(per_rank),
                   **{name: [states[name] for states in per_rank] for name in state.per_rank},
                   "config": self.settings.record, "data": self.data_fingerprint}
        writer = checkpoint.save if replace else checkpoint.save_new
        path = writer(checkpoint.checkpoint_dir(self.run.path), step, payload, self.settings.keep)
        return str(path) if path else None


def own_states(state: TrainingState) -> dict[str, Any]:
    """This rank's per-rank states, by name."""
    return {name: component.state_dict() for name, component in state.per_rank.items()}
