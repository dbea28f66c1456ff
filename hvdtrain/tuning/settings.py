"""How a study runs: one frozen, validated dataclass shared by the CLI, the Python API and both modes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hvdtrain.errors import ConfigError

MODES = ("job", "inprocess")
METRICS = {"val_acc": "maximize", "val_loss": "minimize"}
SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "hyperband", "none")
BACKENDS = ("gloo", "mpi")


@dataclass(frozen=True)
class TuneSettings:
    trials: int                  # finished trials (complete or pruned) the study should hold in all
    dir: str = "tune"            # study journal, trial run dirs, best.yaml, plots
    mode: str = "job"            # job: a horovodrun job per trial; inprocess: trials inside this Horovod job
    np: int = 2                  # job mode: workers per trial
    parallel: int = 1            # job mode: trials running at once (np x parallel processes on this host)
    hosts: str = ""              # job mode: horovodrun -H; default localhost:<np>
    backend: str = "gloo"        # job mode: horovodrun --gloo or --mpi
    metric: str = "val_acc"      # held-out metric to optimise, reported after every epoch
    sampler: str = "tpe"
    pruner: str = "median"
    startup_trials: int = 2      # pruner: complete trials before any trial is pruned
    warmup_epochs: int = 0       # pruner: epochs a trial always runs before it can be pruned
    seed: int = 0                # the sampler's seed (each trial's training seed comes from the config)
    study: str = "hvdtrain"      # study name inside the journal
    max_failures: int = 0        # stop after this many failed trials in one invocation; 0 = same as trials
    grace_s: float = 60.0        # job mode: after SIGTERM, seconds before a trial's job is killed

    def __post_init__(self) -> None:
        for key in ("trials", "np", "parallel"):
            if getattr(self, key) < 1:
                raise ConfigError(f"tune: {key} must be >= 1, got {getattr(self, key)}")
        for key in ("startup_trials", "warmup_epochs", "max_failures"):
            if getattr(self, key) < 0:
                raise ConfigError(f"tune: {key} must be >= 0, got {getattr(self, key)}")
        for key, choices in (("mode", MODES), ("metric", tuple(METRICS)), ("sampler", SAMPLERS),
                             ("pruner", PRUNERS), ("backend", BACKENDS)):
            if getattr(self, key) not in choices:
                raise ConfigError(f"tune: {key} must be one of {', '.join(choices)}; got {getattr(self, key)!r}")
        if not self.dir:
            raise ConfigError("tune: dir must name a folder for the study")
        if self.mode == "inprocess" and self.parallel != 1:
            raise ConfigError("tune: inprocess mode runs one trial at a time in the Horovod job it is in; "
                              "drop --parallel (or use --mode job)")

    @property
    def direction(self) -> Literal["maximize", "minimize"]:
        return "maximize" if METRICS[self.metric] == "maximize" else "minimize"

    @property
    def failure_limit(self) -> int:
        return self.max_failures or self.trials
