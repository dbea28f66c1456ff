"""The callbacks' checks and state (train/callbacks.py) and the LR of each step with a user's scheduler
(train/learning_rate.py): pure, on plain torch optimizers."""
from __future__ import annotations

import pytest
import torch

from hvdtrain.errors import UserError
from hvdtrain.train.callbacks import Callback, Callbacks, check
from hvdtrain.train.learning_rate import LearningRate


class Counting(Callback):
    def __init__(self) -> None:
        self.n = 0

    def on_step_end(self, trainer, step, metrics) -> None:
        self.n += 1

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


class Misspelt:
    def on_epoch_ended(self, trainer, epoch, record) -> bool:
        return True


class Deaf:
    def helper(self) -> None: ...


class HalfState:
    def on_fit_end(self, trainer, history) -> None: ...

    def state_dict(self) -> dict:
        return {}


@pytest.mark.parametrize(("callbacks", "message"), [
    ([Misspelt()], "callback Misspelt has on_epoch_ended, which is no event and would never be called; did you mean "
                   "on_epoch_end?"),
    ([Deaf()], "callback Deaf answers no event: define one of on_fit_start, on_before_optimizer_step"),
    ([HalfState()], "callback HalfState has only one of state_dict/load_state_dict"),
    (Counting(), "callbacks=<"),
])
def test_a_callback_that_would_never_be_called_is_refused_in_one_line(callbacks, message):
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(").replace("?", r"\?")) as caught:
        check(callbacks)
    assert "\n" not in str(caught.value)


def test_only_events_a_callback_defines_count_and_state_travels_by_position_and_class():
    first, plain, second = Counting(), type("Starts", (Callback,), {"on_fit_start": lambda self, t: None})(), Counting()
    callbacks = Callbacks([first, plain, second])
    assert callbacks.wants("on_step_end") and not callbacks.wants("on_epoch_end")   # the base's no-ops don't count
    callbacks.step_end(None, 1, lambda: torch.tensor(2.5), 0.1)
    callbacks.step_end(None, 2, lambda: torch.tensor(2.0), 0.1)
    second.n = 7
    state = callbacks.state_dict()
    assert state == {"0:Counting": {"n": 2}, "2:Counting": {"n": 7}}
    again = Callbacks([Counting(), plain, Counting()])
    again.load_state_dict(state)
    assert [c.n for c in again.items if isinstance(c, Counting)] == [2, 7]
    # A checkpoint without a callback's state (added since) leaves its own; no state at all is None, not {}.
    fresh = Callbacks([Counting()])
    fresh.load_state_dict({"3:Other": {}})
    assert fresh.items[0].n == 0 and Callbacks([plain]).state_dict() is None


def test_step_end_reads_the_loss_only_when_a_callback_listens():
    def loss() -> torch.Tensor:
        raise AssertionError("computed with no callback listening")

    Callbacks([type("OnlyEpochs", (Callback,), {"on_epoch_end": lambda *a: None})()]).step_end(None, 1, loss, 0.1)
    seen = []
    Callbacks([type("Steps", (Callback,), {"on_step_end": lambda self, t, s, m: seen.append((s, m))})()]).step_end(
        None, 3, lambda: torch.tensor(1.5), 0.2, grad_norm=torch.tensor(4.0))
    assert seen == [(3, {"loss": 1.5, "lr": 0.2, "grad_norm": 4.0})]


def test_after_epoch_is_a_callback_for_one_fit_call_only():
    callbacks = Callbacks([Counting()])
    with callbacks.adding(lambda record: True):
        assert len(callbacks.items) == 2 and callbacks.wants("on_epoch_end")
    assert len(callbacks.items) == 1 and not callbacks.wants("on_epoch_end")


def sgd(lr: float = 0.1) -> torch.optim.SGD:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def test_a_schedulers_lr_runs_scaled_for_the_workers_and_is_its_own_again_between_steps():
    optimizer = sgd()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    lr = LearningRate(optimizer, optimizer, decay="cosine", warmup_epochs=0, scheduler=scheduler)
    lr.resize(4.0, 10)      # 4 workers, linear scaling
    applied, between = [], []
    for step in range(5):
        lr.start_step(step, 10)
        applied.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        lr.end_step()
        between.append(optimizer.param_groups[0]["lr"])
    # The default cosine gives way to the scheduler: x4 of StepLR's 0.1, 0.1, 0.05, 0.05, 0.025.
    assert applied == pytest.approx([0.4, 0.4, 0.2, 0.2, 0.1]) and lr.applied == pytest.approx(0.1)
    assert between == pytest.approx([0.1, 0.05, 0.05, 0.025, 0.025])
    assert lr.state_dict()["last_epoch"] == 5


def test_warmup_ramps_the_workers_scale_over_the_schedulers_lr():
    optimizer = sgd()
    lr = LearningRate(optimizer, None, decay="none", warmup_epochs=1, scheduler=lambda o: torch.optim.lr_scheduler
                      .LambdaLR(o, lambda step: 1.0))
    lr.resize(3.0, 4)
    lr.start_step(0, 20)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)        # one worker's LR at step 0
    lr.end_step()
    lr.start_step(2, 20)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.2)        # half-way to x3


def test_per_epoch_schedulers_step_at_epoch_ends_and_plateau_reads_the_monitored_metric():
    optimizer = sgd()
    lr = LearningRate(optimizer, optimizer, decay="none", warmup_epochs=0, interval="epoch",
                      scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5))
    lr.resize(1.0, 5)
    for loss in (1.0, 0.5, 0.7):
        lr.start_step(0, 5)
        lr.end_step()
        lr.end_epoch({"val_loss": loss, "val_acc": 0.0}, monitor="")
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)        # halved once, after 0.7 failed to improve


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"decay": "step"}, "lr_scheduler= and --lr-decay step both schedule the LR: drop one"),
    ({"interval": "batch"}, "lr_scheduler_interval='batch': use 'step' or 'epoch'"),
    ({"other": True}, "lr_scheduler was built on another optimizer than the Trainer's: pass that optimizer as "
                      "optimizer=, or give a factory"),
    ({"scheduler": 0.5}, "lr_scheduler=0.5: give a torch.optim.lr_scheduler scheduler"),
])
def test_a_scheduler_that_cannot_drive_this_optimizer_is_one_line(kwargs, message):
    optimizer = sgd()
    owner = sgd() if kwargs.pop("other", False) else optimizer
    scheduler = kwargs.pop("scheduler", torch.optim.lr_scheduler.StepLR(owner, step_size=1))
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(")):
        LearningRate(optimizer, optimizer, **{"decay": "none", "warmup_epochs": 0, **kwargs}, scheduler=scheduler)
