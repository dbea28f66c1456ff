"""The loop's one set of events, for users and for hvdtrain's own optional features (best weights and early
stopping: train/monitor.py; a tuner's pruning: tuning/inprocess.py).

A callback is any object with some of these methods (subclassing Callback is optional):

    on_fit_start(trainer)                          fit() begins (after a resume has been read)
    on_before_optimizer_step(trainer, optimizer)   gradients averaged across workers (and unscaled for fp16),
                                                   not yet clipped; the step is about to be applied
    on_step_end(trainer, step, metrics)            an optimizer step is done; `metrics`: this worker's
                                                   `loss` of the step, the `lr` applied, `grad_norm` when clipping
    on_epoch_end(trainer, epoch, record)           a finished epoch's record (held-out metrics included, the same
                                                   on every rank); True stops training after it, on every rank
    on_fit_end(trainer, history)                   fit() is done; `history.summary` is filled in
    state_dict() / load_state_dict(state)          the callback's state, saved in checkpoints (rank 0's) and given
                                                   back on resume, on every rank

Every event runs on every rank, in the order the callbacks were given. A callback that writes files or logs should
do so on rank 0 only (`if trainer.world.is_root:`). A stop asked for by any rank stops all of them after the same
epoch: the ranks' answers are summed in one small allreduce, so a callback need not agree with the others itself.
"""
from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from hvdtrain.distributed import collectives
from hvdtrain.errors import UserError

EVENTS = ("on_fit_start", "on_before_optimizer_step", "on_step_end", "on_epoch_end", "on_fit_end")
STATE = ("state_dict", "load_state_dict")


class Callback:
    """A base with every event doing nothing: subclass it and define the ones you need. Every event runs on every
    rank; write files on rank 0 only (`trainer.world.is_root`). Add `state_dict()`/`load_state_dict(state)` for
    state that travels in checkpoints."""

    def on_fit_start(self, trainer: Any) -> None:
        """fit() begins (a resume has been read)."""

    def on_before_optimizer_step(self, trainer: Any, optimizer: Any) -> None:
        """The step's gradients are averaged across the workers (and unscaled for fp16), not yet clipped."""

    def on_step_end(self, trainer: Any, step: int, metrics: dict[str, float]) -> None:
        """After each optimizer step: this worker's `loss`, the `lr` applied, `grad_norm` when clipping."""

    def on_epoch_end(self, trainer: Any, epoch: int, record: dict[str, Any]) -> bool | None:
        """After each finished epoch, with its record; True stops training after it, on every rank."""

    def on_fit_end(self, trainer: Any, history: Any) -> None:
        """fit() is done; `history.summary` is filled in."""


def _defines(callback: Any, event: str) -> bool:
    """Whether `callback` does something at `event` (the base's empty methods do not count)."""
    method = getattr(type(callback), event, None)
    return callable(getattr(callback, event, None)) and method is not getattr(Callback, event, None)


def check(callbacks: Sequence[Any]) -> list[Any]:
    """The callbacks, each checked: one that answers no event, or names a method like an event but misspelt (which
    would never be called), is a one-line UserError naming it and the closest event."""
    if not isinstance(callbacks, (list, tuple)):
        raise UserError(f"callbacks={callbacks!r}: give a list of callback objects, e.g. callbacks=[MyCallback()]")
    for callback in callbacks:
        name = type(callback).__name__
        for attr in dir(type(callback)):
            if attr.startswith("on_") and attr not in EVENTS:
                close = difflib.get_close_matches(attr, EVENTS, n=1)
                hint = f"; did you mean {close[0]}?" if close else f"; the events are {', '.join(EVENTS)}"
                raise UserError(f"callback {name} has {attr}, which is no event and would never be called{hint}")
        if not any(_defines(callback, event) for event in EVENTS) and not hasattr(callback, "state_dict"):
            raise UserError(f"callback {name} answers no event: define one of {', '.join(EVENTS)}")
        if hasattr(callback, "state_dict") != hasattr(callback, "load_state_dict"):
            raise UserError(f"callback {name} has only one of state_dict/load_state_dict: a checkpoint needs both")
    return list(callbacks)


class Callbacks:
    """The callbacks of one Trainer, called in order at each event; Stateful (checkpoint/stateful.py)."""

    def __init__(self, callbacks: Sequence[Any]) -> None:
        self.items = check(callbacks)

    def wants(self, event: str) -> bool:
        return any(_defines(callback, event) for callback in self.items)

    def fit_start(self, trainer: Any) -> None:
        self._call("on_fit_start", trainer)

    def before_optimizer_step(self, trainer: Any, optimizer: Any) -> None:
        self._call("on_before_optimizer_step", trainer, optimizer)

    def step_end(self, trainer: Any, step: int, loss: Callable[[], Any], lr: float, grad_norm: Any = None) -> None:
        """`loss`: gives this step's loss; called (and read back from the device) only when a callback listens, so
        the loop pays nothing for it otherwise."""
        if self.wants("on_step_end"):
            metrics = {"loss": float(loss()), "lr": lr, **({"grad_norm": float(grad_norm)} if grad_norm is not None
                                                            else {})}
            self._call("on_step_end", trainer, step, metrics)

    def epoch_end(self, trainer: Any, epoch: int, record: dict[str, Any]) -> bool:
        """True when any callback on any rank asked to stop (every callback is called all the same)."""
        if not self.wants("on_epoch_end"):
            return False
        asked = [bool(answer) for answer in self._call("on_epoch_end", trainer, epoch, record)]
        # Horovod: one rank's stop is every rank's, after this same epoch.
        return collectives.any_rank(any(asked), name="callbacks_stop")

    def fit_end(self, trainer: Any, history: Any) -> None:
        self._call("on_fit_end", trainer, history)

    @contextmanager
    def adding(self, after_epoch: Callable[[dict[str, Any]], bool] | None) -> Iterator[None]:
        """`fit(after_epoch=fn)`: fn as the last callback's on_epoch_end, for that call only."""
        extra = [_AfterEpoch(after_epoch)] if after_epoch is not None else []
        self.items += extra
        try:
            yield
        finally:
            del self.items[len(self.items) - len(extra):]

    def _call(self, event: str, *args: Any) -> list[Any]:
        return [getattr(callback, event)(*args) for callback in self.items if _defines(callback, event)]

    def state_dict(self) -> dict[str, Any] | None:
        """Each stateful callback's state under its position and class name (None: no callback has state)."""
        state = {_key(i, c): c.state_dict() for i, c in enumerate(self.items) if hasattr(c, "state_dict")}
        return state or None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Give each callback its saved state. One the checkpoint has no state for (added since) keeps its own."""
        for i, callback in enumerate(self.items):
            if hasattr(callback, "load_state_dict") and state and _key(i, callback) in state:
                callback.load_state_dict(state[_key(i, callback)])


class _AfterEpoch:
    def __init__(self, fn: Callable[[dict[str, Any]], bool]) -> None:
        self.fn = fn

    def on_epoch_end(self, trainer: Any, epoch: int, record: dict[str, Any]) -> bool:
        return self.fn(record)


def _key(index: int, callback: Any) -> str:
    return f"{index}:{type(callback).__name__}"
