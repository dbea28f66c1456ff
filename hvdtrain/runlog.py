"""Rank 0's side effects: the run directory, its config, metrics (JSON Lines), summary and weights."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hvdtrain.config import TrainConfig, to_yaml


def plan_run_dir(config: TrainConfig) -> dict[str, str | None]:
    """Pick runs/<name>; refuse to mix a new run into an existing one."""
    name = config.name or f"{config.model}-{config.dataset}-{time.strftime('%Y%m%d-%H%M%S')}"
    name = name.replace(":", "_").replace("/", "_")
    path = Path(config.run_dir) / name
    if path.exists() and any(path.iterdir()):
        return {"path": str(path), "error": f"run directory {path} already holds a run; "
                                            "pass a new --name (or remove it)"}
    return {"path": str(path), "error": None}


class RunLog:
    def __init__(self, path: str, config: TrainConfig, world: Any) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "config.yaml").write_text(to_yaml(config))
        self._metrics = (self.path / "metrics.jsonl").open("a", buffering=1)
        self.world = world

    def metrics(self, record: dict[str, Any]) -> None:
        self._metrics.write(json.dumps({"time": time.time(), **record}) + "\n")

    def epoch(self, record: dict[str, Any], epochs: int) -> None:
        self.metrics(record)
        print(f"epoch {record['epoch'] + 1}/{epochs}  step {record['step']}  "
              f"loss {record['train_loss']:.4f}  acc {record['train_acc']:.4f}  "
              f"val_loss {record['val_loss']:.4f}  val_acc {record['val_acc']:.4f}  "
              f"lr {record['lr']:.4g}  {record['samples_per_s']:.0f} samples/s  "
              f"{record['epoch_time_s']:.2f} s", flush=True)

    def finish(self, summary: dict[str, Any], model: nn.Module) -> None:
        torch.save(model.state_dict(), self.path / "model.pt")
        (self.path / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        self.metrics(summary)
        self._metrics.close()
        print(f"hvdtrain: done  {summary['workers']} worker(s)  {summary['epochs_run']} epochs  "
              f"{summary['steps']} steps  val_loss {summary['val_loss']:.4f}  "
              f"val_acc {summary['val_acc']:.4f}  {summary['samples_per_s']:.0f} samples/s  "
              f"wall {summary['wall_time_s']:.1f} s  -> {self.path}", flush=True)
