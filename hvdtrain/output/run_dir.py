"""Rank 0's files: the run directory, its config, metrics (JSON Lines), summary, weights, plot."""
from __future__ import annotations

import json
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hvdtrain.config.train_config import TrainConfig, to_yaml
from hvdtrain.errors import UserError
from hvdtrain.output.claim import claim, claim_new, release
from hvdtrain.output.console import console
from hvdtrain.output.files import atomic_write, write_text
from hvdtrain.output.plain_weights import plain, plain_state_dict
from hvdtrain.tracking import Tracker, start, system

# The folder `claim_early` took for a run whose data is still loading, for its Trainer to take over.
_early: list[tuple[tuple[str, str, str], dict[str, Any]]] = []


def _names(config: TrainConfig) -> tuple[str, str, str]:
    return config.run_dir, config.name, config.resume


def claim_early(config: TrainConfig) -> dict[str, Any]:
    """plan_run_dir before the data loads (hvdtrain.fit): a refused run is told in one line without first
    loading a dataset that may take minutes. The Trainer built next for this run takes the claim over."""
    plan = _claim(config)
    _early[:] = [(_names(config), plan)]
    return plan


def drop_early() -> None:
    """Give back a claim_early folder no Trainer took over (the data or model failed to build): a run that
    stopped before writing anything leaves no folder behind."""
    if _early:
        _, plan = _early.pop()
        if plan["claim"] is not None:
            release(plan["path"], plan["claim"])


def plan_run_dir(config: TrainConfig) -> dict[str, Any]:
    """Claim runs/<name> for this run (see output/claim.py); refuse a folder another run holds or uses.
    run_dir '' writes nothing. The error, if any, is returned for rank 0 to share with every rank."""
    if _early and _early[0][0] == _names(config):
        return _early.pop()[1]
    drop_early()        # claimed for another run's fit()
    return _claim(config)


def _claim(config: TrainConfig) -> dict[str, Any]:
    if not config.run_dir:
        return {"path": None, "error": None, "claim": None, "job": ""}
    job = secrets.token_hex(8)   # in the lock file: an elastic job's later rank 0 knows its own job's lock by it
    try:
        if config.name:
            path = Path(config.run_dir) / config.name
            token = claim(path, fresh=not config.resume, job=job)
        else:
            stem = f"{config.model}-{config.dataset}-{time.strftime('%Y%m%d-%H%M%S')}"
            path, token = claim_new(config.run_dir, stem.replace(":", "_").replace("/", "_"), job=job)
    except UserError as err:
        return {"path": None, "error": str(err), "claim": None, "job": ""}
    return {"path": str(path), "error": None, "claim": token, "job": job}


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
        if self.tensorboard:
            self.tensorboard.close()
        history.plot(self.path / "curves.png")
        if self.system:
            self.system.stop()
        if self.tracker:
            self.tracker.finish(self.path)


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
