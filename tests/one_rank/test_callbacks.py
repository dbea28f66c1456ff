"""Callbacks, a user's LR scheduler and keyword settings on one real Horovod worker in-process (issue 53); the
2-worker forms (events on every rank, one rank's stop, kill and resume) are in test_callbacks_multirank.py."""
from __future__ import annotations

import pytest
import torch
from support.runs import records

from hvdtrain.config.train_config import load_config
from hvdtrain.data.datasets import build_data
from hvdtrain.errors import ConfigError
from hvdtrain.models.builtin import build_model
from hvdtrain.train.callbacks import Callback
from hvdtrain.train.trainer import Trainer

SMALL = dict(dataset="synthetic", synthetic_samples=300, val_fraction=0.2, synthetic_shape=(1, 8, 8), model="mlp",
             hidden=16, batch_size=40, threads=1, warmup_epochs=0, lr_scaling="none")   # 240 samples: 6 steps
TRAIN = {key: SMALL[key] for key in ("batch_size", "threads", "warmup_epochs", "lr_scaling")}   # as keywords


def parts(**values):
    config = load_config(**{**SMALL, **values})
    torch.manual_seed(config.seed)
    data = build_data(config)
    return build_model(config, (1, 8, 8), 10), data


class Log(Callback):
    def __init__(self) -> None:
        self.seen: list[tuple] = []
        self.lrs: list[float] = []

    def on_fit_start(self, trainer) -> None:
        self.seen.append(("fit_start",))

    def on_step_end(self, trainer, step, metrics) -> None:
        self.seen.append(("step_end", step))
        self.lrs.append(metrics["lr"])

    def on_epoch_end(self, trainer, epoch, record) -> bool:
        self.seen.append(("epoch_end", epoch, record["epoch"]))
        return False

    def on_fit_end(self, trainer, history) -> None:
        self.seen.append(("fit_end", history.summary["steps"]))

    def state_dict(self) -> dict:
        return {"seen": len(self.seen)}

    def load_state_dict(self, state: dict) -> None:
        self.seen = [("restored", state["seen"])]


def test_keyword_settings_sit_over_the_config_and_a_misspelt_one_names_the_closest(one_worker, tmp_path):
    model, data = parts()
    with Trainer(model, data.train, data.val, config=load_config(**SMALL), epochs=1, lr=0.3, run_dir="") as trainer:
        assert (trainer.config.epochs, trainer.config.lr, trainer.config.hidden) == (1, 0.3, 16)
    for typo, closest in (("epoch", "epochs"), ("lr_schedular", "lr_scheduler"), ("callback", "callbacks")):
        with pytest.raises(ConfigError, match=f"^unknown Trainer keyword '{typo}' \\(did you mean '{closest}'\\?\\)$"):
            Trainer(model, data.train, data.val, run_dir=str(tmp_path), **{typo: 1})
    with pytest.raises(ConfigError, match="^epochs must be > 0"):
        Trainer(model, data.train, data.val, epochs=0)
    # Keys that share a name with an argument: a string is the config's (sgd/adam, metric names, a plug-in).
    with Trainer(model, data.train, data.val, **TRAIN, optimizer="adam", metrics="acc,top5_acc", run_dir="") as trainer:
        assert (trainer.config.optimizer, trainer.config.metrics) == ("adam", "acc,top5_acc")
        assert type(trainer.optimizer).__mro__[1] is torch.optim.Adam
    assert not list(tmp_path.iterdir())    # refused before anything was written


def test_events_come_in_order_and_the_callbacks_state_is_in_the_checkpoint_and_restored(one_worker, tmp_path):
    model, data = parts()
    log = Log()
    with Trainer(model, data.train, data.val, **TRAIN, epochs=2, run_dir=str(tmp_path), name="cb",
                 callbacks=[log]) as trainer:
        trainer.fit()
    epoch = [("step_end", s) for s in range(1, 7)]
    assert log.seen == [("fit_start",), *epoch, ("epoch_end", 0, 0), *[("step_end", s) for s in range(7, 13)],
                        ("epoch_end", 1, 1), ("fit_end", 12)]
    last = sorted((tmp_path / "cb" / "checkpoints").glob("ckpt-*.pt"))[-1]
    assert torch.load(last, weights_only=True)["callbacks"] == {"0:Log": {"seen": 15}}   # fit_end comes after it
    model, data = parts()
    again = Log()
    with Trainer(model, data.train, data.val, **TRAIN, epochs=3, run_dir=str(tmp_path), name="cb", resume="auto",
                 callbacks=[again]) as trainer:
        trainer.fit()
    assert again.seen[:2] == [("restored", 15), ("fit_start",)] and again.seen[-1] == ("fit_end", 18)


def test_a_step_lr_per_epoch_is_stepped_saved_and_decays_what_the_records_show(one_worker, tmp_path):
    model, data = parts()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    log = Log()
    with Trainer(model, data.train, data.val, **TRAIN, optimizer=optimizer, epochs=3, run_dir=str(tmp_path),
                 name="step", log_interval=3, callbacks=[log], lr_scheduler_interval="epoch",
                 lr_scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)) as trainer:
        trainer.fit()
    assert log.lrs == pytest.approx([0.2] * 6 + [0.1] * 6 + [0.05] * 6)
    assert [r["lr"] for r in records(tmp_path / "step", "train")] == pytest.approx([0.2, 0.2, 0.1, 0.1, 0.05, 0.05])
    last = sorted((tmp_path / "step" / "checkpoints").glob("ckpt-*.pt"))[-1]
    assert torch.load(last, weights_only=True)["lr_scheduler"]["last_epoch"] == 3


class Stop(Callback):
    def on_epoch_end(self, trainer, epoch, record) -> bool:
        return epoch == 1


def test_a_stop_from_on_epoch_end_ends_training_after_that_epoch(one_worker):
    model, data = parts()
    with Trainer(model, data.train, data.val, **TRAIN, epochs=5, run_dir="", callbacks=[Stop()]) as trainer:
        history = trainer.fit()
    assert len(history) == 2 and history.summary["steps"] == 12
