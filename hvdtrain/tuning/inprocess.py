"""Mode `inprocess`: one long-lived Horovod job runs the trials one after another.

`horovodrun -np 2 python -m hvdtrain tune --mode inprocess ...` starts every rank in this loop. Rank 0
alone owns the study: it asks Optuna for a trial and broadcasts the parameters; every rank trains that
trial together; after each epoch rank 0 reports the held-out metric and broadcasts the pruner's verdict,
so all ranks stop at the same epoch. No process start-up per trial, but a rank that crashes ends the
whole job (re-run the command: the study resumes, the interrupted trial is retried once).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.distributed import collectives, runtime
from hvdtrain.distributed.horovod_settings import horovod_env
from hvdtrain.errors import Stopped, UserError
from hvdtrain.tracking.study_run import StudyRun
from hvdtrain.train.lr_schedule import scaled_lr
from hvdtrain.tuning.space import Param, trial_config
from hvdtrain.tuning.study import Study, open_study
from hvdtrain.tuning.study_report import Progress, announce
from hvdtrain.tuning.train_fn import TrainFn, built_in, describe, fit_trial
from hvdtrain.tuning.tune_settings import TuneSettings


def run_inprocess(space: dict[str, Param], base: TrainConfig, settings: TuneSettings,
                  tracked: StudyRun | None = None, train_fn: TrainFn | None = None) -> Study | None:
    """Every rank runs this; trials go until the study holds settings.trials finished ones.

    Args:
        space: the parsed search space; base: the config each trial starts from; settings: the study's.
        tracked: rank 0's parent run of the study (tracking/study_run.py): each trial's run nests under it.
        train_fn: the user's model and data (train_fn.py); None: the ones the config names.
    Returns:
        The open Study on rank 0 (for the report), None on the other ranks.
    Raises:
        UserError: on every rank at once when rank 0 cannot open the study.
    Example:
        >>> study = run_inprocess(load_space("space.yaml"), load_config(epochs=3), TuneSettings(trials=4))
    """
    world = runtime.init(horovod_env(base))
    study, error = None, None
    if world.is_root:
        try:
            study = open_study(settings)
        except UserError as err:
            error = str(err)
    # Horovod: rank 0's verdict for all, so no rank waits alone in the loop below.
    error = collectives.broadcast_object(error, name="tune_open")
    if error:
        raise UserError(error)
    progress = Progress(settings, study.finished() if study else 0, enabled=world.is_root)
    if study is not None:
        announce(study, progress)
    ranks_log = Path(settings.dir) / "ranks" / f"rank-{world.rank}.jsonl"
    ranks_log.parent.mkdir(parents=True, exist_ok=True)
    folder = str(Path(settings.dir).resolve() / "trials")
    scale = scaled_lr(1.0, world.size, base.lr_scaling)
    failures = 0
    # A trial's tracker (rank 0's, started by its Trainer) finds the study's store and parent run here, as a
    # trial job finds them in its environment.
    nested = _Environment(tracked.env if tracked else {})
    attrs = {"mode": "inprocess", "world_size": world.size, "lr_scaling": base.lr_scaling, "lr_scale": scale,
             **({"train_fn": describe(train_fn)} if train_fn else {})}
    unpruned_said = False
    try:
        while True:
            trial = None
            if study is not None and study.remaining() > 0 and failures < settings.failure_limit:
                trial = study.ask(space, attrs)
                trial.set_user_attr("run_dir", str(Path(folder) / f"trial-{trial.number:04d}"))
            # Horovod: every rank trains the parameters rank 0 sampled.
            plan = collectives.broadcast_object((trial.number, trial.params) if trial else None, name="tune_trial")
            if plan is None:
                break
            number, params = plan
            started = time.monotonic()
            try:
                with nested:
                    outcome = _run_trial(trial, number, params, base, settings, folder, ranks_log, world.rank,
                                         train_fn or built_in)
            except Stopped:     # SIGINT/SIGTERM: every rank stopped at the same step; a re-run retries it
                if study is not None and trial is not None:
                    study.interrupted(trial, "the job was stopped by a signal while this trial ran")
                raise
            if study is not None and trial is not None:
                trial.set_user_attr("duration_s", round(time.monotonic() - started, 2))
                failures += not _record(study, trial, outcome, settings)
                if outcome.get("fitted_by_train_fn") and settings.pruner != "none" and not unpruned_said:
                    unpruned_said = True
                    progress.line(f"tune: {describe(train_fn)} fitted its Trainer itself: inprocess mode cannot "
                                  "prune such trials; return the Trainer unfitted and the tuner fits it")
                if tracked:
                    tracked.trial_done(study.optuna.trials[number], Path(folder) / f"trial-{number:04d}")
                progress.trial_done(study, study.optuna.trials[number])
    finally:
        progress.close()
    return study


def _run_trial(trial: Any, number: int, params: dict[str, Any], base: TrainConfig, settings: TuneSettings,
               folder: str, ranks_log: Path, rank: int, train_fn: TrainFn) -> dict[str, Any]:
    """Train one trial on every rank; the outcome (value, pruned epoch or error) is the same on all."""
    verdicts: list[bool] = []

    def after_epoch(record: dict[str, Any]) -> bool:
        prune = False
        if trial is not None and record.get(settings.metric) is not None:   # rank 0 owns the trial
            trial.report(record[settings.metric], record["epoch"])
            prune = record["epoch"] + 1 < config.epochs and bool(trial.should_prune())
        # Horovod: rank 0's verdict for every rank, so the workers stop together after this epoch.
        prune = collectives.broadcast_object(prune, name="tune_prune")
        verdicts.append(prune)
        return prune

    outcome: dict[str, Any] = {}
    try:
        config = trial_config(base, params, run_dir=folder, name=f"trial-{number:04d}")
        fitted = fit_trial(train_fn, config, after_epoch)
        history = fitted.history
        outcome = {"value": history.summary.get(settings.metric), "pruned_at": len(verdicts) - 1
                   if verdicts and verdicts[-1] else None}
        if not fitted.fitted_by_tuner:   # train_fn fitted it: its epochs are reported now, none could be pruned
            outcome["fitted_by_train_fn"] = True
            if trial is not None:
                for record in history:
                    if record.get(settings.metric) is not None:
                        trial.report(record[settings.metric], record["epoch"])
    except UserError as err:    # a bad combination or a diverged run: the same verdict on every rank
        outcome = {"error": str(err)}
    with ranks_log.open("a") as handle:   # each rank's own account, to check they trained the same trials
        handle.write(json.dumps({"trial": number, "params": params, "pid": os.getpid(), "rank": rank,
                                 "verdicts": verdicts, **outcome}) + "\n")
    return outcome


def _record(study: Study, trial: Any, outcome: dict[str, Any], settings: TuneSettings) -> bool:
    """Rank 0: tell Optuna how the trial ended; False when it failed."""
    from optuna.trial import TrialState

    if "error" in outcome:
        study.fail(trial, outcome["error"])
        return False
    if outcome["pruned_at"] is not None:
        trial.set_user_attr("pruned_at_epoch", outcome["pruned_at"])
        study.optuna.tell(trial, state=TrialState.PRUNED)
        return True
    if outcome["value"] is None:
        study.fail(trial, f"the trial ended without a {settings.metric} (no held-out data?)")
        return False
    study.optuna.tell(trial, outcome["value"])
    return True


class _Environment:
    """Variables set for the duration of a `with` block, then restored as they were."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> None:
        self.saved = {name: os.environ.get(name) for name in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc: object) -> None:
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
