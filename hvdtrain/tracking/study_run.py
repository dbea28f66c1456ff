"""`hvdtrain tune` in MLflow: one parent run per study, each trial's own training run nested under it.

The tune driver owns the parent run (named by the study, kept in <study dir>/tracking.json so a resumed
study continues it). Each trial's job is told the store and the parent's run id through its environment
(MLFLOW_TRACKING_URI, HVDTRAIN_TRACKING_PARENT; a run id is no credential), so the trial's training run is
the nested run, with the resolved config, searched keys included, as its params. When a trial ends, the
driver adds its verdict (tags `tune.state`, `tune.pruned_at_epoch`) and its value (metric `tune/<metric>`).

The driver calls MLflow directly, a few calls per trial, never per step; the first failure is one warning
and the study goes on untracked.
"""
from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hvdtrain.environment.credentials import redact
from hvdtrain.errors import first_line
from hvdtrain.tracking import context
from hvdtrain.tracking.mlflow_sink import RUN_FILE, MlflowSink


class StudyRun:
    """The study's parent run. `env` goes to every trial's job; `trial_done()` after each; `close()` once."""

    def __init__(self, sink: MlflowSink, metric: str, warn: Callable[[str], None]) -> None:
        self.sink = sink
        self.metric = metric
        self.warn = warn
        self.failed = False

    @property
    def env(self) -> dict[str, str]:
        """What a trial's job needs to log into the study's store, nested under its run. A URI with a password is a
        credential (environment/secrets_file.py): the job runner sends it the way of the other credentials."""
        return {} if self.failed else {"MLFLOW_TRACKING_URI": self.sink.uri, context.PARENT_ENV: self.sink.run_id}

    def trial_done(self, trial: Any, run_path: Path) -> None:
        """A finished optuna FrozenTrial: its verdict and value on its run (created here if its job made none)."""
        if self.failed:
            return
        client = self.sink.client
        try:
            run_id = _run_id(run_path, self.sink)
            if not run_id:  # the job died before its tracker started: a run still records the trial
                run = client.create_run(self.sink.experiment_id(), run_name=run_path.name,
                                        tags={"mlflow.parentRunId": self.sink.run_id})
                run_id = run.info.run_id
                for key, value in trial.params.items():
                    client.log_param(run_id, key, redact(str(value))[:context.MAX_PARAM_CHARS])
                client.set_terminated(run_id, status="FAILED")
            client.set_tag(run_id, "tune.trial", str(trial.number))
            client.set_tag(run_id, "tune.state", trial.state.name)
            if "pruned_at_epoch" in trial.user_attrs:
                client.set_tag(run_id, "tune.pruned_at_epoch", str(trial.user_attrs["pruned_at_epoch"]))
            if trial.value is not None:
                client.log_metric(run_id, f"tune/{self.metric}", float(trial.value))
                client.log_metric(self.sink.run_id, f"tune/{self.metric}", float(trial.value), step=trial.number)
        except Exception as err:  # any failure of a tracker is its own, never the study's
            self._fail(f"lost {self.sink.where} ({redact(first_line(err))})")

    def close(self, best: tuple[int, float] | None, files: Sequence[Path], status: str = "FINISHED") -> None:
        """The best trial (number, value) and the study's files on the parent run, then end it."""
        if self.failed:
            return
        try:
            if best is not None:
                self.sink.client.set_tag(self.sink.run_id, "tune.best_trial", str(best[0]))
                self.sink.client.log_metric(self.sink.run_id, f"tune/best_{self.metric}", float(best[1]))
            self.sink.close([path for path in files if path.exists()], status)
        except Exception as err:
            self._fail(f"lost {self.sink.where} ({redact(first_line(err))})")

    def _fail(self, why: str) -> None:
        self.failed = True
        self.sink.give_back_environ()   # no more requests
        self.warn(f"tracking: {why}; the study goes on untracked, its files are whole in its folder")


def start(folder: Path, *, study: str, metric: str, tracking: str, experiment: str, params: Mapping[str, Any],
          say: Callable[[str], None], warn: Callable[[str], None],
          env: Mapping[str, str] | None = None) -> StudyRun | None:
    """The study's parent run when the base config's `tracking` resolves to mlflow here; else None.

    The store is MLFLOW_TRACKING_URI when set, else the study's own sqlite:///<folder>/mlflow.db (the trials'
    run folders are under <folder>/trials, so without this they would each use <folder>/trials/mlflow.db).

    Example:
        >>> run = start(Path("tune"), study="hvdtrain", metric="val_acc", tracking="mlflow",
        ...             experiment="hvdtrain", params={"trials": 4}, say=print, warn=print)  # doctest: +SKIP
    """
    env = os.environ if env is None else env
    if context.resolve(tracking, env) != "mlflow" or importlib.util.find_spec("mlflow") is None:
        return None  # wandb, none, or no mlflow: each trial's own tracker says so
    uri = env.get("MLFLOW_TRACKING_URI", "")
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    sink = MlflowSink(folder, uri or f"sqlite:///{folder / 'mlflow.db'}", experiment, embedded=not uri,
                      name=study, artifact_root=folder / "mlartifacts")
    try:
        said = sink.open({key: context.param_value(value) for key, value in params.items()},
                         {"hvdtrain.kind": "tune study", "tune.study": study, "tune.dir": str(folder)})
    except Exception as err:
        warn(f"tracking: cannot log the study to {sink.where} ({redact(first_line(err))}); it goes on untracked")
        return None
    say(f"tune: tracking: {said}")
    return StudyRun(sink, metric, warn)


def _run_id(run_path: Path, sink: MlflowSink) -> str:
    """The run a trial's job created in this store (its <run>/tracking.json), or ''."""
    try:
        saved = json.loads((run_path / RUN_FILE).read_text())
    except (OSError, ValueError):
        return ""
    return str(saved.get("run_id", "")) if sink.same_store(saved.get("uri", "")) else ""
