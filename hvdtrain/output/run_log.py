"""Rank 0's files in the run directory (output/run_directory.py claims it): its config, metrics (JSON Lines),
summary, weights, plot."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hvdtrain.config.train_config import TrainConfig, to_yaml
from hvdtrain.output.console import console
from hvdtrain.output.files import atomic_write, write_text
from hvdtrain.output.plain_weights import plain, plain_state_dict
from hvdtrain.tracking import Tracker, start, system


class RunLog:
    """Rank 0's files in the run directory. It writes; the console (output/console.py) shows."""

    def __init__(self, path: str, config: TrainConfig, *, backend: str = "", device: str = "",
                 branch_from: int | None = None) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        write_text(self.path / "config.yaml", to_yaml(config))
        self.tensorboard = _tensorboard_writer(self.path / "tensorboard") if config.tensorboard else None
        # A copy for comparing runs (--tracking); its failures are one warning, never the run's.
        self.tracker: Tracker | None = start(self.path, config, backend=backend, device=device, branch_from=branch_from,
                                             say=lambda text: console.line(f"hvdtrain: {text}"),
                                             warn=lambda text: console.line(f"hvdtrain: warning: {text}"))
        # Rank 0 is its host's local rank 0: its host's CPU/memory/GPU go into the same run (tracking/system.py).
        self.system = system.start(self.tracker.record_system) if self.tracker else None

    def metrics(self, record: dict[str, Any]) -> None:
        with (self.path / "metrics.jsonl").open("a") as handle:
            handle.write(json.dumps({"time": time.time(), **record}) + "\n")
        if self.tracker:
            self.tracker.record(record)
        if self.tensorboard and record["kind"] in ("train", "epoch"):
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("epoch", "step"):
                    self.tensorboard.add_scalar(f"{record['kind']}/{key}", value, record["step"])
            if record["kind"] == "epoch":
                self.tensorboard.flush()  # a stopped run keeps its curves up to the last epoch

    def best(self, model: nn.Module) -> None:
        """best.pt and best.safetensors: the weights at the best epoch so far, each replaced atomically."""
        write_weights(self.path, "best", model)

    def finish(self, history: Any, model: nn.Module) -> None:
        summary = history.summary
        write_weights(self.path, "model", model)
        if callable(getattr(model, "save_pretrained", None)):
            write_pretrained(self.path / "hf", plain(model))
        write_text(self.path / "summary.json", json.dumps(summary, indent=2) + "\n")
        self.metrics(summary)
        history.plot(self.path / "curves.png")
        self.close()
        if self.tracker:
            self.tracker.finish(self.path)

    def close(self) -> None:
        """Stop the system sampler and close the TensorBoard file (done by finish; again, harmless)."""
        if self.tensorboard:
            self.tensorboard.close()
            self.tensorboard = None
        if self.system:
            self.system.stop()
            self.system = None


def unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict as safetensors takes it: CPU, contiguous, and no two entries on one storage (tied
    weights, e.g. a language model's embeddings and output layer, are stored once per name)."""
    seen: set[int] = set()
    out = {}
    for key, tensor in state.items():
        tensor = tensor.detach().cpu().contiguous()
        pointer = tensor.untyped_storage().data_ptr()
        out[key] = tensor.clone() if pointer in seen else tensor
        seen.add(pointer)
    return out


def write_weights(folder: Path, name: str, model: nn.Module) -> None:
    """NAME.pt (torch.load) and NAME.safetensors (loads without pickle, in any framework), each atomically."""
    from safetensors.torch import save

    # CPU tensors: the file loads on a machine without a GPU, no map_location needed.
    state = {key: value.detach().cpu() if isinstance(value, torch.Tensor) else value
             for key, value in plain_state_dict(model).items()}  # no torch.compile wrapper in the keys
    atomic_write(folder / f"{name}.pt", lambda handle: torch.save(state, handle))
    data = save(unshared(state), metadata={"format": "pt", "written_by": "hvdtrain"})
    atomic_write(folder / f"{name}.safetensors", lambda handle: handle.write(data))


def write_pretrained(folder: Path, model: Any) -> None:
    """A Hugging Face folder (config.json + model.safetensors) that from_pretrained reads; replaced whole."""
    staging = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    old = folder.with_name(f".{folder.name}.old")
    if folder.exists():
        folder.rename(old)
    staging.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def _tensorboard_writer(path: Path) -> Any:
    """A SummaryWriter when the optional tensorboard package is installed, else None (said once)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        console.notice("tensorboard", "tensorboard is not installed, so no TensorBoard events are written "
                       "(pip install tensorboard, or --tensorboard false to silence this)")
        return None
    return SummaryWriter(log_dir=str(path))
