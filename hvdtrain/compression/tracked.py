"""`compress --tracking`: the report's figures as one MLflow run (rank 0, after the run folder is written)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hvdtrain.compression.compress_options import CompressOptions
from hvdtrain.output.console import console
from hvdtrain.tracking.one_shot import log_run
from hvdtrain.trained.finished_run import FinishedRun


def figures(result: dict[str, Any]) -> tuple[dict[str, str], dict[str, float]]:
    """(params, metrics) of a compress report: the method and its options; per model its size, latency
    and accuracy, keyed by the model's row name (`original/bytes`, `int8_dynamic/latency_ms_batch64`).

    Example:
        >>> figures({"method": "int8", "options": {}, "models": [{"name": "int8 (dynamic)", "bytes": 10,
        ...          "latency_ms": {"1": 0.2}}], "ratios": {"bytes": 2.0}})[1]
        {'int8_dynamic/bytes': 10.0, 'int8_dynamic/latency_ms_batch1': 0.2, 'ratio/bytes': 2.0}
    """
    params = {"method": str(result["method"]), **{f"options.{k}": str(v) for k, v in result["options"].items()}}
    metrics: dict[str, float] = {}
    for row in result["models"]:
        name = re.sub(r"[^\w.-]+", "_", row["name"]).strip("_")
        for key in ("params", "bytes", "export_bytes", "val_acc"):
            if isinstance(row.get(key), (int, float)):
                metrics[f"{name}/{key}"] = float(row[key])
        for prefix in ("latency_ms", "compiled_latency_ms"):
            for batch, value in (row.get(prefix) or {}).items():
                metrics[f"{name}/{prefix}_batch{batch}"] = float(value)
    ratios = result.get("ratios", {})
    for key, value in ratios.items():  # one method: {name: x}; several: {method: {name: x}}
        for name, number in (value.items() if isinstance(value, dict) else [("", value)]):
            metrics["/".join(filter(None, ("ratio", key, name)))] = float(number)
    return params, metrics


def log(run: FinishedRun, opts: CompressOptions, out: Path, result: dict[str, Any]) -> str:
    """Rank 0: the report and the exported model folder as one MLflow run; '' when untracked."""
    params, metrics = figures(result)
    if isinstance(result.get("export"), dict) and "max_abs_diff" in result["export"]:
        metrics["export/max_abs_diff"] = float(result["export"]["max_abs_diff"])
    return log_run(out, tracking=opts.tracking or run.config.tracking, experiment=run.config.tracking_experiment,
                   params=params, metrics=metrics, source=run.path,
                   tags={"hvdtrain.kind": "compress", "source": str(run.path.resolve())},
                   say=lambda text: console.line(f"hvdtrain compress: {text}") if opts.verbose else None,
                   warn=lambda text: console.line(f"hvdtrain compress: warning: {text}"))
