"""Rank-side: a user's own script with callbacks and a OneCycleLR through the Trainer, on every rank.

    python tests/ranks/callbacks_job.py OUT_DIR [--key value ...]

Each rank writes OUT_DIR/events-RANK.jsonl (every event it saw) and, at the end, OUT_DIR/final-RANK.json (its
callback's state). Variables: CB_STOP_RANK and CB_STOP_EPOCH (that rank alone asks to stop after that epoch),
CB_KILL_STEP (rank 0 SIGKILLs itself at the end of that step).
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch

import hvdtrain
from hvdtrain.data.datasets import build_data, input_shape
from hvdtrain.models.builtin import build_model

out = Path(sys.argv[1])
config = hvdtrain.load_config(None, sys.argv[2:])
STOP_RANK, STOP_EPOCH = int(os.environ.get("CB_STOP_RANK", -1)), int(os.environ.get("CB_STOP_EPOCH", -1))
KILL_STEP = int(os.environ.get("CB_KILL_STEP", 0))


class Recorder:
    """Every event, in order, with what a user would look at; its state counts steps and epochs seen."""

    def __init__(self) -> None:
        self.steps_seen, self.epochs_seen = 0, 0
        self.file = None

    def write(self, trainer, event: str, **fields) -> None:
        if self.file is None:
            self.file = (out / f"events-{trainer.world.rank}.jsonl").open("a")
        self.file.write(json.dumps({"event": event, **fields}) + "\n")
        self.file.flush()

    def on_fit_start(self, trainer) -> None:
        self.write(trainer, "fit_start", step=trainer.progress.step, steps_seen=self.steps_seen)

    def on_before_optimizer_step(self, trainer, optimizer) -> None:
        # The averaged gradients: equal on every rank, though each rank's own batch differs.
        grads = [p.grad.double().abs().sum().item() for p in trainer.model.parameters() if p.grad is not None]
        self.write(trainer, "before_step", step=trainer.progress.step + 1, grad_sum=sum(grads),
                   lr=optimizer.param_groups[0]["lr"])

    def on_step_end(self, trainer, step, metrics) -> None:
        self.steps_seen += 1
        self.write(trainer, "step_end", step=step, **metrics)
        if step == KILL_STEP and trainer.world.rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_epoch_end(self, trainer, epoch, record) -> bool:
        self.epochs_seen += 1
        self.write(trainer, "epoch_end", epoch=epoch, step=record["step"])
        return trainer.world.rank == STOP_RANK and epoch == STOP_EPOCH

    def on_fit_end(self, trainer, history) -> None:
        self.write(trainer, "fit_end", step=trainer.progress.step, epochs=len(history))
        (out / f"final-{trainer.world.rank}.json").write_text(json.dumps(self.state_dict()))

    def state_dict(self) -> dict:
        return {"steps_seen": self.steps_seen, "epochs_seen": self.epochs_seen}

    def load_state_dict(self, state: dict) -> None:
        self.steps_seen, self.epochs_seen = state["steps_seen"], state["epochs_seen"]


torch.manual_seed(config.seed)
data = build_data(config)
model = build_model(config, input_shape(data.train), data.num_classes)
optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=0.9)
total = config.epochs * 8   # an upper bound on the steps (the test's runs take fewer): the cycle's length
with hvdtrain.Trainer(model, data.train, data.val, optimizer=optimizer, config=config, callbacks=[Recorder()],
                      lr_scheduler=torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=config.lr,
                                                                       total_steps=total)) as trainer:
    trainer.fit()
