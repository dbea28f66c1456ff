"""Rank 0's side effects: the run directory, its config, metrics (JSON Lines), summary, weights, plot."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hvdtrain.config.train_config import TrainConfig, to_yaml


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
    def __init__(self, path: str, config: TrainConfig) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "config.yaml").write_text(to_yaml(config))
        self.epochs = config.epochs
        self._header_done = False
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

    def epoch(self, record: dict[str, Any], bar: Any = None) -> None:
        self.metrics(record)
        columns = [("epoch", f"{record['epoch'] + 1}"), ("step", f"{record['step']}"),
                   ("loss", _num(record["train_loss"])), ("acc", _num(record["train_acc"])),
                   ("val_loss", _num(record.get("val_loss"))), ("val_acc", _num(record.get("val_acc"))),
                   ("lr", f"{record['lr']:.4g}"), ("samples/s", f"{record['samples_per_s']:.0f}"),
                   ("step_ms", _num(record.get("step_time_s"), 1000, ".1f")),
                   ("time_s", f"{record['epoch_time_s']:.2f}")]
        lines = []
        if not self._header_done:
            lines.append("  ".join(f"{name:>9}" for name, _ in columns))
            self._header_done = True
        lines.append("  ".join(f"{value:>9}" for _, value in columns))
        for line in lines:
            if bar is not None:
                bar.write(line)  # above the bar, not through it
            else:
                print(line, flush=True)

    def best(self, model: nn.Module) -> None:
        """best.pt: the weights at the best epoch so far, replaced atomically (a crash leaves the old one)."""
        tmp = self.path / ".best.pt.tmp"
        torch.save(model.state_dict(), tmp)
        os.replace(tmp, self.path / "best.pt")

    def finish(self, history: Any, model: nn.Module) -> None:
        summary = history.summary
        torch.save(model.state_dict(), self.path / "model.pt")
        (self.path / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        self.metrics(summary)
        if self.tensorboard:
            self.tensorboard.close()
        history.plot(self.path / "curves.png")
        if summary.get("monitor") and summary["best_epoch"] >= 0:
            how = "stopped early; " if summary["stopped_early"] else ""
            print(f"hvdtrain: {how}best {summary['monitor']} {_num(summary['best'])} at epoch "
                  f"{summary['best_epoch'] + 1} -> {self.path / 'best.pt'}", flush=True)
        print(f"hvdtrain: done  {summary['workers']} worker(s)  {summary['epochs_run']} epochs  "
              f"{summary['steps']} steps  val_loss {_num(summary.get('val_loss'))}  "
              f"val_acc {_num(summary.get('val_acc'))}  {summary['samples_per_s']:.0f} samples/s  "
              f"wall {summary['wall_time_s']:.1f} s  -> {self.path}", flush=True)


def _num(value: float | None, scale: float = 1.0, spec: str = ".4f") -> str:
    return "-" if value is None else f"{value * scale:{spec}}"


def _tensorboard_writer(path: Path) -> Any:
    """A SummaryWriter when the optional tensorboard package is installed, else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(log_dir=str(path))
