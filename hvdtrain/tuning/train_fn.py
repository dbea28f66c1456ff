"""Your own code in a study: `train_fn(config)` builds the trial's model and data and returns an hvdtrain.Trainer.

Both modes run a trial through `fit_trial`: the built-in model and data are one more train_fn (`built_in`),
so pruning, the run folder and the recorded value come the same way for yours and for the built-ins.

- inprocess mode calls the function it was given (a lambda, a notebook's function: anything callable);
- job mode starts each trial as a new process, which imports it from a reference `module:function`
  (`hvdtrain tune --train-fn mymod:train`; from Python, a function of an importable module is turned into one).

Return the Trainer unfitted (built with `config=config`, the trial's config): the tuner fits it and the pruner
can stop it after any epoch. A Trainer (or the History of one) that train_fn fitted itself is accepted; job mode
still prunes it (the tune process signals the trial's job), inprocess mode cannot and says so.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hvdtrain.errors import ConfigError, UserError

if TYPE_CHECKING:
    from hvdtrain.config.train_config import TrainConfig
    from hvdtrain.output.history import History
    from hvdtrain.train.trainer import AfterEpoch, Trainer

TrainFn = Callable[["TrainConfig"], Any]
REFERENCE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
RETURNS = ("train_fn must return an hvdtrain.Trainer built with config=config (unfitted: the tuner fits it and "
           "can prune it) or the History of its fit")


def check_reference(text: str) -> None:
    """A `module:function` reference, checked for its shape only (importing it is resolve's job).

    Raises:
        ConfigError: not of the form module.path:function.
    Example:
        >>> check_reference("mymod:train")
    """
    if not REFERENCE.fullmatch(text):
        raise ConfigError(f"tune: train_fn must be 'module:function' (e.g. mymod:train, a function at the top "
                          f"of an importable module), got {text!r}")


def resolve(reference: str) -> TrainFn:
    """Import a `module:function` reference (the workers run from this directory: a module there imports).

    Raises:
        UserError: the module does not import, or has no such function.
    Example:
        >>> resolve("mymod:train")
    """
    check_reference(reference)
    module_name, _, name = reference.partition(":")
    try:
        module = _import(module_name)
    except ImportError as err:
        raise UserError(f"tune: cannot import module {module_name!r} for --train-fn {reference}: {err} (run from "
                        "the folder that holds it, or put that folder on PYTHONPATH)") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise UserError(f"tune: module {module_name!r} ({getattr(module, '__file__', '?')}) has no function "
                        f"{name!r} for --train-fn {reference}")
    return function


def _import(module_name: str) -> Any:
    """The module, from sys.path or else from the working folder (the `hvdtrain` console script's sys.path starts
    at its own folder, not the one it runs in; the trial workers get that folder on PYTHONPATH)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        top = module_name.partition(".")[0]
        if err.name != top:
            raise
        spec = importlib.machinery.PathFinder.find_spec(top, [os.getcwd()])
        if spec is None or spec.loader is None:
            raise
        module = importlib.util.module_from_spec(spec)
        sys.modules[top] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(top, None)
            raise
        return importlib.import_module(module_name)   # a submodule: found through the package's own __path__


def worker_import_path(reference: str, env: Mapping[str, str]) -> dict[str, str]:
    """PYTHONPATH for the trials' workers to import train_fn's module from where this process found it."""
    folder = search_path(reference) if reference else None
    if not folder:
        return {}
    return {"PYTHONPATH": os.pathsep.join(p for p in (folder, env.get("PYTHONPATH", "")) if p)}


def reference_of(function: TrainFn) -> str | None:
    """`module:function` for a function that a new process can import and find again, else None (a lambda, a
    nested function, one defined in __main__: a script or a notebook)."""
    module_name, name = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    if not module_name or module_name == "__main__" or not REFERENCE.fullmatch(f"{module_name}:{name}"):
        return None
    module = sys.modules.get(module_name)
    return f"{module_name}:{name}" if module is not None and getattr(module, name, None) is function else None


def describe(train_fn: TrainFn | str | None) -> str:
    """What trials are trained with, for records and lines: 'mymod:train', '__main__.train', or ''."""
    if train_fn is None or isinstance(train_fn, str):
        return train_fn or ""
    return reference_of(train_fn) or f"{getattr(train_fn, '__module__', '?')}.{getattr(train_fn, '__qualname__', '?')}"


def for_job(train_fn: TrainFn | str) -> str:
    """The reference each trial job imports, checked here, before any trial starts.

    Raises:
        ConfigError: a function a new process cannot import (the error says what to do instead).
        UserError: a reference whose module does not import.
    """
    if isinstance(train_fn, str):
        resolve(train_fn)
        return train_fn
    reference = reference_of(train_fn)
    if reference is None:
        raise ConfigError(f"tune: job mode starts each trial as a new process, which cannot import train_fn "
                          f"{describe(train_fn)} (a lambda, a nested function or one defined in __main__); put it "
                          "at the top of a module (mymod.py: def train(config): ...) and pass train_fn=mymod.train, "
                          "or use mode='inprocess'")
    return reference


def trial_program(config_file: Path, reference: str) -> list[str]:
    """What each worker of a job-mode trial runs: `python -m hvdtrain --config FILE`, or with a train_fn
    `python -m hvdtrain.tuning.trial_worker --train-fn REF --config FILE`.

    Example:
        >>> trial_program(Path("t/trial-0001.yaml"), "mymod:train")[1:4]
        ['-m', 'hvdtrain.tuning.trial_worker', '--train-fn']
    """
    if not reference:
        return [sys.executable, "-m", "hvdtrain", "--config", str(config_file)]
    return [sys.executable, "-m", "hvdtrain.tuning.trial_worker", "--train-fn", reference, "--config",
            str(config_file)]


def search_path(reference: str) -> str | None:
    """The folder a trial job's workers need on PYTHONPATH to import `reference` as this process does (the
    folder above its top package), or None when nothing is needed: installed, or the working folder (which the
    workers' `python -m` puts on their path)."""
    top = sys.modules.get(reference.partition(":")[0].split(".")[0])
    file = getattr(top, "__file__", None)
    if not file:
        return None
    path = Path(file).resolve()
    root = path.parent.parent if path.name == "__init__.py" else path.parent
    return None if root == Path.cwd().resolve() or "site-packages" in root.parts else str(root)


def built_in(config: TrainConfig) -> Trainer:
    """The train_fn of a study without one: the model and data the config names, in a Trainer to fit."""
    from hvdtrain.data.datasets import build_data, input_shape
    from hvdtrain.models.builtin import build_model
    from hvdtrain.train.trainer import Trainer

    data = build_data(config)
    return Trainer(build_model(config, input_shape(data.train), data.num_classes), data.train, data.val,
                   config=config)


@dataclass(frozen=True)
class TrialFit:
    """What a trial's training gave: its History, and whether the tuner fitted it (so after_epoch could prune)."""
    history: History
    fitted_by_tuner: bool


def fit_trial(train_fn: TrainFn, config: TrainConfig, after_epoch: AfterEpoch | None = None) -> TrialFit:
    """Train one trial: `train_fn(config)`, then fit the Trainer it returned (unless it fitted it already).

    Args:
        train_fn: the user's function (or built_in); config: the trial's resolved config.
        after_epoch: the tuner's per-epoch hook (report, prune), given to fit(); unused if train_fn fitted.
    Returns:
        A TrialFit.
    Raises:
        UserError: train_fn returned something else, or a Trainer not built with the trial's config.
    Example:
        >>> fit_trial(train, trial_config(base, {"lr": 0.1}, name="trial-0000")).history.summary["val_acc"]
    """
    import torch

    from hvdtrain.output.history import History
    from hvdtrain.train.trainer import Trainer

    torch.manual_seed(config.seed)   # as hvdtrain.fit: the same weights for the same trial, on every rank
    made = train_fn(config)
    if isinstance(made, History):
        _check_where(made.summary.get("run_dir") or Path(config.run_dir, config.name), config, train_fn)
        return TrialFit(made, fitted_by_tuner=False)
    if not isinstance(made, Trainer):
        raise UserError(f"tune: {RETURNS}; {describe(train_fn)} returned {type(made).__name__}")
    with made as trainer:   # the run folder goes back when the trial ends, whatever happens
        _check_where(Path(trainer.config.run_dir, trainer.config.name), config, train_fn)
        if trainer.history:
            return TrialFit(trainer.history, fitted_by_tuner=False)
        return TrialFit(trainer.fit(after_epoch=after_epoch), fitted_by_tuner=True)


def _check_where(run: str | Path, config: TrainConfig, train_fn: TrainFn) -> None:
    """The trial's run must be in the trial's folder: the tuner reads its metrics and best.yaml its config there."""
    trial = Path(config.run_dir, config.name)
    if Path(run).resolve() != trial.resolve():
        raise UserError(f"tune: {RETURNS}: the run of {describe(train_fn)} went to {run}, not to the trial's "
                        f"{trial} (pass config=config to hvdtrain.Trainer)")
