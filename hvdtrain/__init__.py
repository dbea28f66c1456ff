"""hvdtrain: a maintained Horovod trainer for PyTorch 2.x.

The public API, for scripts and notebooks:
    Trainer, fit, launch, tune, compress, load_config, TrainConfig, History, Callback (docs/how-to/extend.md);
    errors in hvdtrain.errors;
    prepare, save, load for a training loop of your own (docs/migrating.md);
    Spark in hvdtrain.spark (fit); Ray in hvdtrain.ray (fit).

Where things live: config/ (the one config), data/, models/, train/ (the loop), distributed/ (the one
Horovod importer), output/ (console, run directory), launcher/ (workers from Python), cluster/
(hostfiles, schedulers), spark/, ray/, tuning/ (Optuna search, `hvdtrain tune`), compression/ (int8, pruning,
distillation), cli/ (the `hvdtrain` command).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hvdtrain.environment.process import export_rank_env
from hvdtrain.train import run_start

# Before the user's own code builds a webdataset or mosaicml-streaming pipeline: they shard by RANK and
# WORLD_SIZE, which horovodrun and mpirun do not set (HVDTRAIN_EXPORT_RANK_ENV=0 leaves them alone).
export_rank_env()


def _take_secrets(environ: Any) -> str | None:
    """A run's start reads the secrets file as every worker of `hvdtrain launch` does (launcher/worker_start.py).
    launcher/ sits above train/ in the layers, so its reader is handed down from here, where both are in reach (as
    distributed hands environment its rank); imported when a run starts (`python -m hvdtrain.launcher.worker_start`
    must find it not yet imported)."""
    from hvdtrain.launcher.worker_start import take_secrets

    return take_secrets(environ)


run_start.use_secrets_reader(_take_secrets)

__version__ = "0.1.0"
__all__ = ["Trainer", "fit", "launch", "tune", "compress", "load_config", "TrainConfig", "History", "prepare", "save",
           "load", "Callback"]

if TYPE_CHECKING:  # what IDEs and mypy see; at run time the names load on first use (below)
    from hvdtrain.compression.compress_api import compress
    from hvdtrain.config.train_config import TrainConfig, load_config
    from hvdtrain.launcher.local import launch
    from hvdtrain.output.history import History
    from hvdtrain.train.callbacks import Callback
    from hvdtrain.train.config_fit import fit
    from hvdtrain.train.own_loop import load, prepare, save
    from hvdtrain.train.trainer import Trainer
    from hvdtrain.tuning.tune_api import tune

_HOME = {"Trainer": "hvdtrain.train.trainer", "fit": "hvdtrain.train.config_fit",
         "launch": "hvdtrain.launcher.local", "load_config": "hvdtrain.config.train_config",
         "TrainConfig": "hvdtrain.config.train_config", "History": "hvdtrain.output.history",
         "tune": "hvdtrain.tuning.tune_api", "compress": "hvdtrain.compression.compress_api",
         "prepare": "hvdtrain.train.own_loop", "save": "hvdtrain.train.own_loop", "load": "hvdtrain.train.own_loop",
         "Callback": "hvdtrain.train.callbacks"}


def __getattr__(name: str) -> Any:
    # Lazy, so `import hvdtrain` (a CLI's --help, the Spark driver) does not load torch.
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'hvdtrain' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
