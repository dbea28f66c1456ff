"""MLflow, through its client only (no fluent `mlflow.start_run`: no global active run, no atexit of MLflow's).

Runs only on the tracker's background thread: importing MLflow takes seconds, and every call may block on
a server.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hvdtrain.environment.caller import give_back
from hvdtrain.environment.credentials import looks_secret, redact

# MLflow retries a failed request 7 times with a doubling backoff and waits 120 s for an answer, so a
# server that is down would be noticed after minutes. A training job wants to know in seconds; the user's
# own settings win.
QUICK_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
              "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
# MLflow prints "View run at <the URI, password included>" when a run ends, unless this says "true".
NO_URL_PRINTED = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
# log_batch takes at most 1000 metrics and 100 params per call.
METRICS_PER_CALL = 1000
PARAMS_PER_CALL = 100
RUN_FILE = "tracking.json"


class MlflowSink:
    """One MLflow run for one run folder: created once, found again from <run>/tracking.json on resume."""

    def __init__(self, run_dir: Path, uri: str, experiment: str, *, embedded: bool, name: str = "",
                 artifact_root: Path | None = None) -> None:
        self.run_dir = run_dir
        self.uri = uri
        self.experiment = experiment
        self.embedded = embedded
        self.name = name or run_dir.name
        # The embedded store keeps artifacts beside mlflow.db, not in ./mlartifacts of whatever folder
        # training happened to start in.
        self.artifact_root = artifact_root or run_dir.resolve().parent / "mlartifacts"
        self.client: Any = None
        self.run_id = ""
        self.resumed = False
        # What open() found and set of MLflow's variables in os.environ (MLflow reads them at every request),
        # given back by close() or give_back_environ(): a notebook's or test runner's process outlives the run.
        self.environ: tuple[dict[str, str], dict[str, str]] | None = None

    @property
    def shown_uri(self) -> str:
        # http://user:password@host names its own credential: show the host only; the rest redacted as anywhere
        # else (a ?token= in the URI, say).
        scheme, sep, rest = self.uri.partition("://")
        return redact(f"{scheme}{sep}{rest.rpartition('@')[2]}")

    def same_store(self, saved_uri: str) -> bool:
        """Whether a tracking.json's uri (written redacted, user:***@) names this sink's store."""
        return bool(saved_uri) and redact(saved_uri) == redact(self.uri)

    @property
    def where(self) -> str:
        return f"MLflow at {self.shown_uri}"

    def open(self, params: Mapping[str, str], tags: Mapping[str, str]) -> str:
        """Connect, create the run or take up the one this folder already has; returns what happened."""
        # Named variables only: this may run on the tracker's thread while the training thread changes others.
        names = [*QUICK_HTTP, NO_URL_PRINTED]
        before = {name: os.environ[name] for name in names if name in os.environ}
        for name, value in QUICK_HTTP.items():
            os.environ.setdefault(name, value)
        if looks_secret(self.uri):
            os.environ[NO_URL_PRINTED] = "true"
        self.environ = before, {name: os.environ[name] for name in names if name in os.environ}
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        known = self._known_run()
        if known:
            self.run_id = known.info.run_id
            self.resumed = True
            self.client.update_run(self.run_id, status="RUNNING")
            # Params are write-once in MLflow: a resumed run keeps the values it started with.
            params = {k: v for k, v in params.items() if k not in known.data.params}
            said = f"continuing MLflow run {self.run_id}"
        else:
            run = self.client.create_run(self.experiment_id(), tags={k: redact(v) for k, v in tags.items()},
                                         run_name=self.name)
            self.run_id = run.info.run_id
            self._remember()
            said = f"MLflow run {self.run_id}"
        items = [Param(k, redact(v)) for k, v in params.items()]   # a value may be a URI with a password
        for first in range(0, len(items), PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, params=items[first:first + PARAMS_PER_CALL], synchronous=True)
        return f"{said} in {self.shown_uri} (experiment {self.experiment!r})"

    def log(self, metrics: Sequence[tuple[str, float, int, int]]) -> None:
        """(name, value, step, unix ms) each, in calls of at most 1000."""
        from mlflow.entities import Metric

        items = [Metric(name, value, stamp, step) for name, value, step, stamp in metrics]
        for first in range(0, len(items), METRICS_PER_CALL):
            self.client.log_batch(self.run_id, metrics=items[first:first + METRICS_PER_CALL], synchronous=True)

    def logged_steps(self) -> dict[str, int]:
        """The last step of each metric the run already holds ({} for a new run): one call per metric, once."""
        if not self.resumed:
            return {}
        names = self.client.get_run(self.run_id).data.metrics
        return {name: max((m.step for m in self.client.get_metric_history(self.run_id, name)), default=-1)
                for name in names}

    def close(self, artifacts: Sequence[Path], status: str) -> None:
        try:
            for path in artifacts:
                self.client.log_artifact(self.run_id, str(path))
            self.client.set_terminated(self.run_id, status=status)
        finally:
            self.give_back_environ()

    def give_back_environ(self) -> None:
        """MLflow's variables as open() found them (a value changed since is left alone); twice is harmless."""
        if self.environ is not None:
            give_back(os.environ, *self.environ)
            self.environ = None

    def experiment_id(self) -> str:
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            return str(found.experiment_id)
        location = self.artifact_root.as_uri() if self.embedded else None
        try:
            return str(self.client.create_experiment(self.experiment, artifact_location=location))
        except MlflowException:  # another job created it between our two calls
            return str(self.client.get_experiment_by_name(self.experiment).experiment_id)

    def _known_run(self) -> Any:
        """This folder's run in this store, if an earlier process of the same run (resume) created it."""
        try:
            saved = json.loads((self.run_dir / RUN_FILE).read_text())
        except (OSError, ValueError):
            return None
        if saved.get("tracker") != "mlflow" or not self.same_store(saved.get("uri", "")) or not saved.get("run_id"):
            return None
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_run(saved["run_id"])
        except MlflowException:  # deleted from the store since: a new run is the only choice
            return None

    def _remember(self) -> None:
        """<run>/tracking.json: the run id for `--resume auto`, written whole (a crash leaves none or all).

        The store's URI is written redacted: the file is uploaded with the run's files (`hvdtrain compress`)."""
        path = self.run_dir / RUN_FILE
        tmp = path.with_name(f".{RUN_FILE}.tmp")
        tmp.write_text(json.dumps({"tracker": "mlflow", "uri": redact(self.uri), "run_id": self.run_id,
                                   "experiment": self.experiment, "created": time.time()}, indent=2) + "\n")
        os.replace(tmp, path)
