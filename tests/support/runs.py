"""What a finished run left in its folder, read one way everywhere, and the jobs several test files train.

A run folder holds metrics.jsonl (one JSON record a line: train, epoch, summary...), model.pt (the final
weights), summary.json and config.yaml.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import torch

# A job small enough to compare weights across launches: 2 workers x batch b must equal 1 worker x 2b.
EQUIV = ["--dataset", "synthetic", "--synthetic-samples", "640", "--val-fraction", "0.2",
         "--synthetic-shape", "1,8,8", "--model", "mlp", "--hidden", "32", "--lr", "0.05",
         "--lr-scaling", "none", "--warmup-epochs", "0", "--max-steps", "12", "--log-interval", "4",
         "--threads", "1"]
# The job the stop-and-resume tests stop mid-epoch (horovodrun, hvdtrain launch, Slurm): 1,437 digits on 2 workers,
# 32 a worker, 23 steps an epoch (the last one padded), 46 in all, a checkpoint every 10 steps; faults:slow_mlp holds
# every rank while FAULTS_HOLD_FILE exists, after FAULTS_HOLD_AFTER steps.
STOPPABLE_DIGITS = ["--dataset", "digits", "--val-fraction", "0.2005", "--batch-size", "32",
                    "--model", "faults:slow_mlp", "--hidden", "16", "--epochs", "2", "--checkpoint-steps", "10",
                    "--keep-checkpoints", "10", "--threads", "1", "--log-interval", "1"]


def records(run: Path, kind: str | None = None) -> list[dict]:
    """The records of the run's metrics.jsonl in order, only those of `kind` ("train", "epoch"...) if given."""
    found = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return found if kind is None else [r for r in found if r.get("kind") == kind]


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    """The run's final weights (model.pt)."""
    return torch.load(run / "model.pt", weights_only=True)


def assert_same_weights(ours: dict[str, torch.Tensor] | Path, theirs: dict[str, torch.Tensor] | Path) -> None:
    """Equal to 1e-6: weights, or run folders whose final weights are compared. A resumed run must end where the
    uninterrupted one did, to the float."""
    a, b = (final_weights(w) if isinstance(w, Path) else w for w in (ours, theirs))
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-6, rtol=0)


class DefaultJob(NamedTuple):
    """The default job trained once per session (conftest's default_job fixture)."""
    run: Path            # its run folder: summary.json, metrics.jsonl, config.yaml...
    stdout: str

    def last_epoch(self) -> dict:
        return records(self.run, "epoch")[-1]
