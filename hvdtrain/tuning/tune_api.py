"""`hvdtrain.tune(...)`: the one entry point of a study, for the CLI and for Python. A table of contents:
parse and check the space, open (or resume) the study, run the trials in the chosen mode, report."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hvdtrain.config.train_config import TrainConfig, load_config
from hvdtrain.environment import process
from hvdtrain.errors import ConfigError
from hvdtrain.tracking.study_run import StudyRun
from hvdtrain.tracking.study_run import start as start_study_run
from hvdtrain.tuning.space import Param, check_against, load_space, parse_space
from hvdtrain.tuning.srun_trials import in_allocation
from hvdtrain.tuning.study import Study, open_study, trial_summary, write_trials_json
from hvdtrain.tuning.study_report import Progress, announce, results_table, say, write_best, write_plots
from hvdtrain.tuning.train_fn import TrainFn, describe, for_job, reference_of, resolve
from hvdtrain.tuning.tune_settings import TuneSettings


@dataclass(frozen=True)
class TuneResult:
    """A study's outcome as plain data (the same on every rank of an inprocess job)."""
    dir: str
    best_number: int | None          # None when no trial completed
    best_value: float | None
    best_params: dict[str, Any]
    best_config: str | None          # TUNE_DIR/best.yaml
    trials: list[dict[str, Any]] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def tune(space: str | dict[str, Any], trials: int, *, config: TrainConfig | str | None = None,
         train_fn: TrainFn | str | None = None, **options: Any) -> TuneResult:
    """Search hyperparameters with Optuna, each trial trained with Horovod; resumes a study left in `dir`.

    Args:
        space: a space YAML file, or the same mapping as a dict (see hvdtrain/tuning/space.py).
        trials: finished trials (complete or pruned) the study should hold in all.
        config: the base config (a TrainConfig or a YAML path); each trial overrides the searched keys.
        train_fn: your own model and data: `train_fn(config)` gets the trial's TrainConfig and returns an
            hvdtrain.Trainer built with `config=config`, unfitted (the tuner fits it, so the pruner can stop it).
            Any callable in inprocess mode; job mode imports it in each trial's job: a function at the top of
            an importable module, or its reference 'module:function'. Default: the model and data `config` names.
        **options: TuneSettings fields: dir, mode ("job" or "inprocess"), np, parallel, metric, sampler,
            pruner, startup_trials, warmup_epochs, seed, study, hosts, backend, max_failures.
    Returns:
        A TuneResult: the best trial, its value and parameters, best.yaml's path, every trial, the plots.
    Raises:
        ConfigError: a bad space, config, option or train_fn (before any trial runs).
    Example:
        >>> result = hvdtrain.tune({"lr": {"type": "float", "low": 0.01, "high": 0.3, "log": True}}, 6,
        ...                        config=hvdtrain.load_config(model="mlp", epochs=5), np=2, parallel=2)
        >>> result.best_value, result.best_config
        >>> hvdtrain.tune("space.yaml", 8, train_fn=mymod.train, np=2, parallel=2)   # your own model
    """
    if train_fn is not None and not isinstance(train_fn, str) and not callable(train_fn):
        raise ConfigError(f"tune: train_fn must be a function or 'module:function', got {type(train_fn).__name__}")
    reference = train_fn if isinstance(train_fn, str) else reference_of(train_fn) if train_fn else ""
    settings = TuneSettings(trials=trials, train_fn=reference or "", **options)
    if settings.launcher == "srun":
        settings = in_allocation(settings, os.environ)   # the study folder a requeue finds again
    params = load_space(space) if isinstance(space, str) else parse_space(space)
    base = config if isinstance(config, TrainConfig) else load_config(config)
    check_against(params, base)
    if settings.mode == "inprocess":
        function = train_fn if callable(train_fn) else resolve(settings.train_fn) if settings.train_fn else None
        return _inprocess(params, base, settings, function)
    if process.launched() and settings.launcher != "srun":   # Slurm's batch shell looks launched: it is not
        raise ConfigError("tune: job mode starts a horovodrun job per trial itself: run `hvdtrain tune` without "
                          "horovodrun, or add --mode inprocess to run the trials inside this Horovod job")
    if train_fn:
        for_job(train_fn)   # importable by a new process: said now, not as a failed trial per job
    study = open_study(settings)
    tracked = None
    try:
        progress = Progress(settings, study.finished())
        announce(study, progress)
        from hvdtrain.tuning.job_runner import run_jobs

        tracked = _track(settings, base)
        try:
            run_jobs(study, params, base, progress, tracked)
        finally:
            progress.close()
        result = _report(study, base)
        if tracked:
            _close(tracked, settings, result)
        return result
    except BaseException:
        if tracked:
            tracked.close(None, [], "KILLED")
        raise
    finally:
        study.close()


def _track(settings: TuneSettings, base: TrainConfig, train_fn_label: str = "") -> StudyRun | None:
    """The study's parent MLflow run when the base config is tracked (each trial's run nests under it)."""
    return start_study_run(Path(settings.dir), study=settings.study, metric=settings.metric,
                           tracking=base.tracking, experiment=base.tracking_experiment,
                           params={**asdict(settings), "model": base.model, "dataset": base.dataset,
                                   **({"train_fn": train_fn_label} if train_fn_label else {})}, say=say,
                           warn=lambda text: say(f"hvdtrain: warning: {text}"))


def _close(tracked: StudyRun, settings: TuneSettings, result: TuneResult) -> None:
    """The best trial and the study's files on the parent run, which ends here."""
    number, value = result.best_number, result.best_value
    files = [Path(settings.dir) / "trials.json", *map(Path, [result.best_config or "", *result.plots])]
    tracked.close(None if number is None or value is None else (number, value), [f for f in files if f.is_file()])


def _inprocess(params: dict[str, Param], base: TrainConfig, settings: TuneSettings,
               train_fn: TrainFn | None) -> TuneResult:
    from hvdtrain.distributed import collectives, runtime
    from hvdtrain.distributed.horovod_settings import horovod_env
    from hvdtrain.tuning.inprocess import run_inprocess

    # Rank 0 alone holds the study's parent run; its trials' runs nest under it as in job mode.
    tracked = _track(settings, base, describe(train_fn)) if process.is_rank_zero() else None
    result = None
    try:
        with runtime.started(horovod_env(base)):   # the caller's os.environ is given back after the trials
            study = run_inprocess(params, base, settings, tracked, train_fn)
        if study is not None:   # rank 0
            try:
                result = _report(study, base)
            finally:
                study.close()
        if tracked and result:
            _close(tracked, settings, result)
    except BaseException:
        if tracked:
            tracked.close(None, [], "KILLED")
        raise
    # Horovod: every rank returns rank 0's result.
    return collectives.broadcast_object(result, name="tune_result")


def _report(study: Study, base: TrainConfig) -> TuneResult:
    """Table, trials.json, best.yaml and plots; a line for each."""
    settings, optuna_study = study.settings, study.optuna
    trials = optuna_study.get_trials(deepcopy=False)
    say(results_table(trials, settings))
    write_trials_json(study)
    best_file = write_best(optuna_study, settings, base.run_dir or "runs")
    plots, notes = write_plots(optuna_study, settings)
    best = optuna_study.best_trial if best_file else None
    if best is not None:
        say(f"tune: best trial {best.number}: {settings.metric} {best.value:.4f} -> {best_file}")
    else:
        notes.append("no trial completed: no best.yaml (see the trial logs in "
                     f"{Path(settings.dir) / 'trials'})")
    for note in notes:
        say(f"tune: {note}")
    say(f"tune: plots {', '.join(str(p) for p in plots)}")
    return TuneResult(dir=settings.dir, best_number=best.number if best else None,
                      best_value=best.value if best else None, best_params=dict(best.params) if best else {},
                      best_config=str(best_file) if best_file else None,
                      trials=[trial_summary(t) for t in trials], plots=[str(p) for p in plots], notes=notes)
