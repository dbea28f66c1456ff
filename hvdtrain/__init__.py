"""hvdtrain: a maintained Horovod trainer for PyTorch 2.x.

The public API, for scripts and notebooks:
    Trainer, fit, launch, load_config, TrainConfig, History
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Trainer", "fit", "launch", "load_config", "TrainConfig", "History"]

_HOME = {"Trainer": "hvdtrain.trainer", "fit": "hvdtrain.trainer", "launch": "hvdtrain.launcher",
         "load_config": "hvdtrain.config", "TrainConfig": "hvdtrain.config", "History": "hvdtrain.history"}


def __getattr__(name: str) -> Any:
    # Lazy, so `import hvdtrain` (e.g. by the Horovod build script's tests) does not load torch.
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'hvdtrain' has no attribute {name!r}")
