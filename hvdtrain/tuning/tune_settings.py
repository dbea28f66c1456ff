"""How a study runs: one frozen, validated dataclass shared by the CLI, the Python API and both modes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hvdtrain.config.fields import option
from hvdtrain.errors import ConfigError
from hvdtrain.tuning.train_fn import check_reference

MODES = ("job", "inprocess")
METRICS = {"val_acc": "maximize", "val_loss": "minimize"}
SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "hyperband", "none")
BACKENDS = ("gloo", "mpi")
LAUNCHERS = ("horovodrun", "srun")


@dataclass(frozen=True)
class TuneSettings:
    """How a study runs; every field is a flag of `hvdtrain tune` (hvdtrain/cli/option_flags.py generates them)."""
    trials: int = option(help="finished trials (complete or pruned) the study should hold in all")
    dir: str = option("tune", "study folder: journal, trial run dirs, best.yaml, plots")
    mode: str = option("job", "job: a horovodrun job per trial; inprocess: trials inside this Horovod job",
                       choices=MODES)
    np: int = option(2, "job mode: workers per trial")
    parallel: int = option(1, "job mode: trials running at once (np x parallel processes on this host)")
    hosts: str = option("", "job mode: horovodrun -H; '' = localhost:NP")
    backend: str = option("gloo", "job mode: Gloo or MPI (srun: --mpi=none or --mpi=pmix)", choices=BACKENDS)
    launcher: str = option("horovodrun", "job mode: horovodrun per trial, or srun: a job step per trial inside "
                           "this Slurm allocation", choices=LAUNCHERS)
    metric: str = option("val_acc", "held-out metric to optimise, reported after every epoch", choices=tuple(METRICS))
    sampler: str = option("tpe", "Optuna sampler", choices=SAMPLERS)
    pruner: str = option("median", "Optuna pruner; none = every trial runs all its epochs", choices=PRUNERS)
    startup_trials: int = option(2, "pruner: complete trials before any trial is pruned", flag="--pruner-startup",
                                 metavar="N")
    warmup_epochs: int = option(0, "pruner: epochs a trial always runs before it can be pruned",
                                flag="--pruner-warmup", metavar="EPOCHS")
    seed: int = option(0, "the sampler's seed (--seed is each trial's training seed, a config key)",
                       flag="--sampler-seed")
    study: str = option("hvdtrain", "study name inside the journal")
    max_failures: int = option(0, "stop after this many failed trials in one invocation; 0 = same as trials")
    grace_s: float = option(60.0, "job mode: after SIGTERM, seconds before a trial's job is killed")
    train_fn: str = option("", "your own model and data: 'module:function' taking the trial's TrainConfig and "
                           "returning an hvdtrain.Trainer built with it, unfitted (the tuner fits and prunes it); "
                           "'' = the model and data the config names", metavar="MODULE:FUNCTION")

    def __post_init__(self) -> None:
        for key in ("trials", "np", "parallel"):
            if getattr(self, key) < 1:
                raise ConfigError(f"tune: {key} must be >= 1, got {getattr(self, key)}")
        for key in ("startup_trials", "warmup_epochs", "max_failures", "grace_s"):
            if getattr(self, key) < 0:
                raise ConfigError(f"tune: {key} must be >= 0, got {getattr(self, key)}")
        for key, choices in (("mode", MODES), ("metric", tuple(METRICS)), ("sampler", SAMPLERS),
                             ("pruner", PRUNERS), ("backend", BACKENDS), ("launcher", LAUNCHERS)):
            if getattr(self, key) not in choices:
                raise ConfigError(f"tune: {key} must be one of {', '.join(choices)}; got {getattr(self, key)!r}")
        if self.train_fn:
            check_reference(self.train_fn)
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
