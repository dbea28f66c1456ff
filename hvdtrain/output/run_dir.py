"""Rank 0's files: the run directory, its config, metrics (JSON Lines), summary, weights, plot."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hvdtrain.config.train_config import TrainConfig, to_yaml
from hvdtrain.output.console import console
from hvdtrain.output.files import atomic_write, write_text


def plan_run_dir(config: TrainConfig) -> dict[str, Any]:
    """Pick runs/<name>; refuse to mix a new run into an existing one. run_dir '' writes nothing."""
    if not config.run_dir:
        return {"path": None, "error": None}
    if config.name:
        path = Path(config.run_dir) / config.name
        if path.exists() and any(path.iterdir()) and not config.resume:
            return {"path": str(path), "error": f"run directory {path} already holds a run; "
                                                "pass a new --name, or --resume auto to continue it"}
        return {"path": str(path), "error": None}
    stem = f"{config.model}-{config.dataset}-{time.strftime('%Y%m%d-%H%M%S')}"
    stem = stem.replace(":", "_").replace("/", "_")
    path = Path(config.run_dir) / stem
    suffix = 1
    while path.exists():  # two runs in the same second, e.g. fit twice in a notebook
        suffix += 1
        path = Path(config.run_dir) / f"{stem}-{suffix}"
    return {"path": str(path), "error": None}


class RunLog:
    """Rank 0's files in the run directory. It writes; the console (output/console.py) shows."""

    def __init__(self, path: str, config: TrainConfig) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        write_text(self.path / "config.yaml", to_yaml(config))
        self.tensorboard = _tensorboard_writer(self.path / "tensorboard") if config.tensorboard else None

    def metrics(self, record: dict[str, Any]) -> None:
        with (self.path / "metrics.jsonl").open("a") as handle:
            handle.write(json.dumps({"time": time.time(), **record}) + "\n")
        if self.tensorboard and record["kind"] in ("train", "epoch"):
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("epoch", "step"):
                    self.tensorboard.add_scalar(f"{record['kind']}/{key}", value, record["step"])
            if record["kind"] == "epoch":
                self.tensorboard.flush()  # a stopped run keeps its curves up to the last epoch

    def best(self, model: nn.Module) -> None:
        """best.pt: the weights at the best epoch so far, replaced atomically (a crash leaves the old one)."""
        atomic_write(self.path / "best.pt", lambda handle: torch.save(model.state_dict(), handle))

    def finish(self, history: Any, model: nn.Module) -> None:
        summary = history.summary
        atomic_write(self.path / "model.pt", lambda handle: torch.save(model.state_dict(), handle))
        write_text(self.path / "summary.json", json.dumps(summary, indent=2) + "\n")
        self.metrics(summary)
        if self.tensorboard:
            self.tensorboard.close()
        history.plot(self.path / "curves.png")


def _tensorboard_writer(path: Path) -> Any:
    """A SummaryWriter when the optional tensorboard package is installed, else None (said once)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        console.notice("tensorboard", "tensorboard is not installed, so no TensorBoard events are written "
                       "(pip install tensorboard, or --tensorboard false to silence this)")
        return None
    return SummaryWriter(log_dir=str(path))
