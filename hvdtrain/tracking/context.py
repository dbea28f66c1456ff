"""What a tracked run is told about itself: which tracker, its params, its tags, its metrics."""
from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.environment import process
from hvdtrain.environment.credentials import redact

# Keys of a metrics record that place it (they are the step axis, not a curve of their own).
PLACE_KEYS = ("kind", "epoch", "step", "time")
# MLflow 3 stores a param value of up to 6000 characters and refuses a longer one.
MAX_PARAM_CHARS = 6000
# Set by `hvdtrain tune` for its trials' jobs: the study's MLflow run, which each trial's run is nested under.
PARENT_ENV = "HVDTRAIN_TRACKING_PARENT"


def resolve(choice: str, env: Mapping[str, str]) -> str:
    """The tracker `--tracking` means here: auto is mlflow when a team server is named, else none.

    Example:
        >>> resolve("auto", {"MLFLOW_TRACKING_URI": "http://mlflow:5000"}), resolve("auto", {})
        ('mlflow', 'none')
    """
    if choice != "auto":
        return choice
    return "mlflow" if env.get("MLFLOW_TRACKING_URI") else "none"


def embedded_store(run_dir: Path) -> str:
    """The serverless default: one sqlite file beside the run folders, so `mlflow ui` there shows them all.

    Example:
        >>> embedded_store(Path("/work/runs/cnn-digits"))
        'sqlite:////work/runs/mlflow.db'
    """
    return f"sqlite:///{run_dir.resolve().parent / 'mlflow.db'}"


def params(config: TrainConfig, tracker: str) -> dict[str, str]:
    """The resolved config, every key, as the strings a tracker stores (`tracking` as resolved), redacted.

    Redacted before they are cut to MLflow's length: a URI cut between its password and the '@' no longer
    shows where the password ends, and its start would be stored.
    """
    values = {**config.to_dict(), "tracking": tracker}
    return {key: param_value(value) for key, value in values.items()}


def param_value(value: object) -> str:
    """A value as a tracker may store it: redacted first, then cut to MLflow's length (in that order).

    Example:
        >>> param_value("postgresql://app:" + "x" * 6000 + "@db/runs")
        'postgresql://app:***@db/runs'
    """
    return redact(str(value))[:MAX_PARAM_CHARS]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def tags(run_dir: Path, config: TrainConfig, *, backend: str = "", device: str = "") -> dict[str, str]:
    """Versions and the job's shape, redacted. `backend`/`device` come from the trainer when it knows them.

    No tag holds a git commit id today; one would be kept: a bare 40-hex value is not redacted
    (environment/credentials.py says why).
    """
    import torch

    me = process.current()
    if not backend:  # who started the workers says how they talk: horovodrun --gloo sets HOROVOD_*, MPI its own
        launched = process.from_env(os.environ)
        backend = ("one process" if me.size == 1 else "Gloo" if launched and launched.launcher == "gloo"
                   else "MPI" if launched and launched.launcher in ("openmpi", "mpich", "pmix") else "unknown")
    if not device:  # the trainer's rule (train/device.py): auto is CUDA when torch sees a GPU
        device = "cuda" if config.device != "cpu" and torch.cuda.is_available() else "cpu"
    found = {"hvdtrain.version": _version("hvdtrain"), "horovod.version": _version("horovod"),
             "torch.version": torch.__version__, "backend": backend, "workers": str(me.size),
             "hosts": str(-(-me.size // max(1, me.local_size))), "device": device,
             "run_dir": str(run_dir.resolve())}
    return {key: redact(value) for key, value in found.items()}


def metrics(record: Mapping[str, Any]) -> tuple[int, dict[str, float]]:
    """(step, {name: value}) of a metrics.jsonl record, named as in TensorBoard: `train/loss`, `epoch/val_acc`.

    Example:
        >>> metrics({"kind": "train", "epoch": 0, "step": 20, "loss": 0.5, "lr": 0.1})
        (20, {'train/loss': 0.5, 'train/lr': 0.1})
    """
    kind = record.get("kind", "")
    values = {f"{kind}/{key}": float(value) for key, value in record.items()
              if key not in PLACE_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool)}
    return int(record.get("step") or 0), values
