"""hvdtrain.tune of your own model (issue 52): a model class and data defined in this file, built by `train(config)`
for every trial, 4 trials on 2 workers, the bad ones pruned. Job mode: each trial a real horovodrun job whose workers
import this module (`test_tune_own_model:train`), 2 at a time, then best.yaml trained again with the same train_fn.
Inprocess mode: this file run as the rank-side script under horovodrun (train is then __main__'s, as in a notebook),
tracked in MLflow, and resumed by a second run.

The rank-side part (`python tests/multirank/test_tune_own_model.py DIR TRIALS`) is at the bottom. Its top-level
imports stay few: every trial's workers import this module.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import hvdtrain

FEATURES, CLASSES = 8, 4
GOOD, BAD = 0.05, 1e-5           # SGD learning rates (x2 on 2 workers): ~all right after one epoch; barely moving
HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]


class TinyNet(nn.Module):
    """The user's own model: nothing hvdtrain knows by name."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def blobs(samples: int, seed: int) -> TensorDataset:
    """4 well-separated Gaussian blobs in 8 dimensions (the same centers for every split)."""
    centers = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(0)) * 3
    draw = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (samples,), generator=draw)
    return TensorDataset(centers[labels] + torch.randn(samples, FEATURES, generator=draw), labels)


def train(config: hvdtrain.TrainConfig) -> hvdtrain.Trainer:
    """The train_fn: the trial's config (lr and hidden searched) in, an unfitted Trainer out."""
    return hvdtrain.Trainer(TinyNet(config.hidden), blobs(config.synthetic_samples, 1), blobs(128, 2), config=config)


def base(**keys: object) -> hvdtrain.TrainConfig:
    return hvdtrain.load_config(**{"epochs": 3, "batch_size": 16, "synthetic_samples": 512, "threads": 1,
                                   "tensorboard": False, "log_interval": 4, **keys})


def rows(study: Path) -> list[dict]:
    return json.loads((study / "trials.json").read_text())


def epochs_run(row: dict) -> int:
    from support.runs import records  # here, not on top: the trials' workers import this module without tests/

    return len(records(Path(row["run_dir"]), "epoch"))


def test_job_mode_tunes_a_model_class_of_this_file_2_trials_at_a_time_and_prunes_the_bad_ones(tmp_path, monkeypatch):
    from support.processes import horovodrun, show

    monkeypatch.chdir(tmp_path)   # the trials' workers find this module through the PYTHONPATH tune gives them
    study = tmp_path / "study"
    # Random sampler, seed 24: lr GOOD, GOOD, BAD, BAD. Trials 0 and 1 run together and train the same (same params
    # and seed), so neither prunes the other; trials 2 and 3 start once one of them is complete: pruned at once.
    # Epochs of ~0.5 s, 10 of them: the tune process has seconds to read epoch 1 and stop a bad trial's job.
    result = hvdtrain.tune({"lr": {"type": "categorical", "choices": [GOOD, BAD]}}, 4, train_fn=train,
                           config=base(hidden=16, tracking="none", epochs=10, synthetic_samples=2048),
                           dir=str(study), np=2, parallel=2, sampler="random", seed=24, startup_trials=1)
    trials = rows(study)
    assert [t["params"]["lr"] for t in trials] == [GOOD, GOOD, BAD, BAD], "the sampler drew another order"
    assert [t["state"] for t in trials] == ["COMPLETE", "COMPLETE", "PRUNED", "PRUNED"], trials
    assert all(t["train_fn"] == "test_tune_own_model:train" and t["world_size"] == 2 for t in trials)
    assert trials[0]["value"] == trials[1]["value"] >= 0.95, trials
    assert all(epochs_run(good) == 10 for good in trials[:2])
    for bad in trials[2:]:
        assert bad["pruned_at_epoch"] == 0 and epochs_run(bad) < 10, bad                   # stopped early...
        assert "hvdtrain: stopped by SIGTERM" in Path(bad["log"]).read_text()           # ...by the tune process
    assert result.best_number in (0, 1) and result.best_value == trials[0]["value"]

    # best.yaml says how to train it again with this train_fn; run as written, it trains the same again.
    best = Path(result.best_config or "")
    line = next(line for line in best.read_text().splitlines() if "horovodrun -np 2" in line)
    program = line.split(" python ", 1)[1].split()
    assert program == ["-m", "hvdtrain.tuning.trial_worker", "--train-fn", "test_tune_own_model:train", "--config",
                       str(best)], line
    again = horovodrun(2, program, "gloo", cwd=tmp_path, env={"PYTHONPATH": f"{HERE.parent}{os.pathsep}{ROOT}"})
    assert again.returncode == 0, show(again)
    [reproduced] = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/summary.json")]
    assert reproduced["val_acc"] == result.best_value, reproduced


def test_inprocess_mode_under_horovodrun_tunes_a_main_function_tracks_and_resumes(tmp_path):
    import pytest
    from support.processes import horovodrun, show

    MlflowClient = pytest.importorskip("mlflow.tracking").MlflowClient

    study = tmp_path / "study"
    env = {"PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": ""}
    proc = horovodrun(2, [str(HERE), str(study), "4"], "gloo", env=env, timeout=300)
    assert proc.returncode == 0, show(proc)
    trials = rows(study)
    # Random sampler, seed 11: (lr, hidden) = (GOOD, 32), (BAD, 32), (GOOD, 32), (BAD, 8).
    assert [(t["params"]["lr"], t["params"]["hidden"]) for t in trials] == [(GOOD, 32), (BAD, 32), (GOOD, 32),
                                                                           (BAD, 8)], "another order: pick a seed"
    assert [t["state"] for t in trials] == ["COMPLETE", "PRUNED", "COMPLETE", "PRUNED"], trials
    assert all(t["train_fn"] == "__main__.train" and t["world_size"] == 2 for t in trials)
    assert all(t["pruned_at_epoch"] == 0 and epochs_run(t) == 1 for t in trials if t["state"] == "PRUNED")
    ranks = [[json.loads(line) for line in (study / "ranks" / f"rank-{r}.jsonl").read_text().splitlines()]
             for r in (0, 1)]
    assert [t["verdicts"] for t in ranks[0]] == [t["verdicts"] for t in ranks[1]]     # stopped together
    assert proc.stdout.count("tune: trial ") == 4, proc.stdout                         # rank 0 alone speaks
    best = (study / "best.yaml").read_text()
    assert "where SCRIPT fits the Trainer that __main__.train(hvdtrain.load_config(" in best

    # The same command with one trial more: the study resumes and runs only that one.
    again = horovodrun(2, [str(HERE), str(study), "5"], "gloo", env=env, timeout=300)
    assert again.returncode == 0, show(again)
    assert "4 of 5 trials finished" in again.stdout and again.stdout.count("tune: trial ") == 1, again.stdout
    trials = rows(study)
    assert len(trials) == 5 and trials[4]["state"] == "COMPLETE" and trials[4]["params"]["lr"] == GOOD

    # Each run of the study is a parent MLflow run in the study's store, with a nested run per trial it ran.
    client = MlflowClient(f"sqlite:///{study / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert parents and all(r.data.params["train_fn"] == "__main__.train" for r in parents), parents
    nested = sorted(int(r.data.tags["tune.trial"]) for r in runs if "mlflow.parentRunId" in r.data.tags)
    assert nested == [0, 1, 2, 3, 4], nested


def _rank_side(folder: str, trials: int) -> None:
    """Every rank runs this under horovodrun; `train` is this script's own, as a notebook's would be."""
    result = hvdtrain.tune({"lr": {"type": "categorical", "choices": [GOOD, BAD]},
                            "hidden": {"type": "categorical", "choices": [8, 32]}}, trials, train_fn=train,
                           config=base(tracking="mlflow"), dir=folder, mode="inprocess", sampler="random", seed=11,
                           startup_trials=1)
    assert result.best_value is not None and result.best_value >= 0.95, result


if __name__ == "__main__":
    _rank_side(sys.argv[1], int(sys.argv[2]))
