"""A finished piece of work logged whole as one MLflow run (`hvdtrain compress`): params, metrics, the files.

Unlike a training run nothing streams, so rank 0 makes the few calls itself, after the work is written; the
first failure is one warning and the work's own files are the record.
"""
from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from hvdtrain.environment.credentials import redact
from hvdtrain.errors import first_line
from hvdtrain.tracking import context
from hvdtrain.tracking.mlflow_sink import RUN_FILE, MlflowSink


def log_run(folder: Path, *, tracking: str, experiment: str, params: Mapping[str, str],
            metrics: Mapping[str, float], tags: Mapping[str, str], say: Callable[[str], None],
            warn: Callable[[str], None], source: Path | None = None, env: Mapping[str, str] | None = None) -> str:
    """Log `folder` (every file in it as an artifact) as one finished MLflow run named by the folder.

    The store is MLFLOW_TRACKING_URI, else the embedded sqlite:///<folder's parent>/mlflow.db (where the
    source run's is when the folder sits beside it). `source`: a tracked run folder this work came from,
    linked by the tag `hvdtrain.source_run_id` when it is in the same store.
    Returns:
        The MLflow run id, or '' when untracked (tracking resolves to none, or it failed: one warning).
    Example:
        >>> log_run(Path("runs/mlp-int8"), tracking="mlflow", experiment="hvdtrain", params={"method": "int8"},
        ...         metrics={"original/bytes": 9e4}, tags={}, say=print, warn=print)  # doctest: +SKIP
    """
    env = os.environ if env is None else env
    chosen = context.resolve(tracking, env)
    if chosen == "none":
        return ""
    if chosen != "mlflow" or importlib.util.find_spec("mlflow") is None:
        warn(f"tracking: {chosen} is not available here (pip install -e '.[tracking]' in hvdtrain's "
             "checkout for mlflow); "
             "the results are in their folder only")
        return ""
    uri = env.get("MLFLOW_TRACKING_URI", "")
    sink = MlflowSink(folder, uri or context.embedded_store(folder), experiment, embedded=not uri)
    tags = dict(tags)
    try:
        saved = json.loads((source / RUN_FILE).read_text()) if source else {}
    except (OSError, ValueError):
        saved = {}
    if sink.same_store(saved.get("uri", "")) and saved.get("run_id"):
        tags["hvdtrain.source_run_id"] = str(saved["run_id"])
    try:
        said = sink.open({k: context.param_value(v) for k, v in params.items()}, tags)
        from mlflow.entities import Metric

        stamp = int(os.path.getmtime(folder) * 1000)
        items = [Metric(name, float(value), stamp, 0) for name, value in metrics.items()]
        for first in range(0, len(items), 1000):
            sink.client.log_batch(sink.run_id, metrics=items[first:first + 1000], synchronous=True)
        sink.client.log_artifacts(sink.run_id, str(folder))
        sink.client.set_terminated(sink.run_id, status="FINISHED")
    except Exception as err:  # any failure of a tracker is its own, never the work's
        warn(f"tracking: cannot log {folder} to {sink.where} ({redact(first_line(err))}); "
             "the results are in the folder")
        return ""
    finally:
        sink.give_back_environ()
    say(f"tracking: {said}")
    return sink.run_id
