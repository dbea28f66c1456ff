"""A script of your own gets the CLI's stop (train/run_start.py, issue 52): SIGUSR1 while its Trainer trains writes
a checkpoint at the step the ranks agree on and ends the script with the CLI's one line, not a traceback. The stop
handlers are the Trainer's only while fit() trains (hvdtrain.fit's: for its whole run), and handle_signals=False (a
notebook's) leaves the process's own. The plain loop docs/how-to/own-script.md diffs against train.py runs. On
Slurm, with a requeue: tests/cluster/test_slurm_own_script.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.paths import ROOT
from support.processes import show
from torch import nn
from torch.utils.data import TensorDataset

import hvdtrain
from hvdtrain.train.signals import STOP, STOP_SIGNALS

ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
SCRIPT = '''"""A user's script whose model sends its process SIGUSR1 at training step 3: a scheduler's warning."""
import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

import hvdtrain


class WarnedAt(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.steps = inner, 0

    def forward(self, x):
        if self.training:
            self.steps += 1
            if self.steps == 3:
                os.kill(os.getpid(), signal.SIGUSR1)
        return self.inner(x)


g = torch.Generator().manual_seed(0)
x = torch.randn(256, 8, generator=g)
data = TensorDataset(x, (x.sum(dim=1) > 0).long())
config = hvdtrain.load_config(None, sys.argv[1:])
with hvdtrain.Trainer(WarnedAt(nn.Linear(8, 2)), data, config=config) as trainer:
    trainer.fit()
print("not reached: the stop ends the script")
'''


def handlers() -> list[object]:
    return [signal.getsignal(sig) for sig in STOP_SIGNALS]


@pytest.fixture
def own_excepthook(monkeypatch):
    """A Trainer wraps sys.excepthook once per process; the test process gets its own back."""
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)


def test_usr1_while_the_own_script_trains_checkpoints_and_ends_it_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    done = subprocess.run([sys.executable, "train.py", "--epochs", "3", "--batch-size", "16", "--log-interval", "1",
                           "--threads", "1", "--name", "warned", "--tensorboard", "false"],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, show(done)
    assert done.stderr.strip().splitlines()[-1] == ("hvdtrain: stopped by SIGUSR1 at step 3; checkpoint "
                                                    "runs/warned/checkpoints/ckpt-000000003.pt"), show(done)
    assert "Traceback" not in done.stderr and "not reached" not in done.stdout, show(done)
    assert (tmp_path / "runs" / "warned" / "checkpoints" / "ckpt-000000003.pt").exists()


def test_the_trainer_handles_signals_while_it_trains_and_not_with_handle_signals_false(own_excepthook) -> None:
    before = handlers()
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    data = TensorDataset(x, (x.sum(dim=1) > 0).long())
    config = hvdtrain.load_config(epochs=1, batch_size=16, run_dir="", threads=1, progress_bar="off")
    during: list[list[object]] = []
    with hvdtrain.Trainer(nn.Linear(8, 2), data, config=config) as trainer:
        assert handlers() == before                     # not yet: a bare Trainer handles them in fit()
        trainer.fit(after_epoch=lambda record: during.append(handlers()) and False)
        assert handlers() == before                     # given back when fit() ends
    with hvdtrain.Trainer(nn.Linear(8, 2), data, config=config, handle_signals=False) as trainer:
        trainer.fit(after_epoch=lambda record: during.append(handlers()) and False)
    assert during == [[STOP.handle] * 3, before]
    hvdtrain.fit(hvdtrain.load_config(model="mlp", dataset="synthetic", synthetic_samples=64, synthetic_shape=(8,),
                                      hidden=8, epochs=1, run_dir="", threads=1, progress_bar="off"))
    assert handlers() == before and STOP.signum == 0


def test_the_plain_loop_the_docs_start_from_runs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "own_script" / "plain.py")], cwd=tmp_path,
                          env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, show(done)
    assert "epoch 3 val_acc" in done.stdout and (tmp_path / "model.pt").exists(), show(done)
