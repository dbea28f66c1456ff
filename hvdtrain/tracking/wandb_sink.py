"""Weights & Biases, offline by default: the run is written into the run folder for a later `wandb sync`.

A cluster's workers often have no route to api.wandb.ai, and a training job should not wait on one; so unless
WANDB_MODE says otherwise (`online` with WANDB_API_KEY, which travels the secrets path like any credential),
wandb writes `<run>/wandb/offline-run-<time>-<id>/` and `wandb sync <that folder>` uploads it later. Runs only on
the tracker's background thread, like the MLflow sink: wandb.init starts its service process and may block.
"""
from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from hvdtrain.environment.credentials import redact
from hvdtrain.tracking import wandb_files
from hvdtrain.tracking.mlflow_sink import RUN_FILE

SUMMARY = "summary/"
SYSTEM = "system/"


class WandbSink:
    """One W&B run for one run folder; `--resume auto` continues it (same run id, from <run>/tracking.json)."""

    def __init__(self, run_dir: Path, project: str, *, mode: str = "offline") -> None:
        self.run_dir = run_dir
        self.project = project
        self.mode = mode
        self.run: Any = None
        self.run_id = ""
        self.resumed = False
        self.last_step = 0

    @property
    def where(self) -> str:
        return f"W&B ({self.mode}, {self.run_dir / 'wandb'})" if self.mode == "offline" else f"W&B ({self.mode})"

    def open(self, params: Mapping[str, str], tags: Mapping[str, str]) -> str:
        import wandb

        try:
            saved = json.loads((self.run_dir / RUN_FILE).read_text())
        except (OSError, ValueError):
            saved = {}
        self.resumed = saved.get("tracker") == "wandb" and bool(saved.get("run_id"))
        self.run_id = saved["run_id"] if self.resumed else uuid.uuid4().hex[:8]   # W&B's own id shape
        self.last_step = 0      # each run has its own step axis (a rollback's branch opens a second one)
        # console="off": hvdtrain's own lines stay as they are (no wrapping of stdout in a Horovod job).
        self.run = wandb.init(project=self.project, name=self.run_dir.name, id=self.run_id, dir=str(self.run_dir),
                              mode=cast(Any, self.mode), resume="allow" if self.resumed else None,
                              config={**{k: redact(v) for k, v in params.items()},
                                      "hvdtrain": {k: redact(v) for k, v in tags.items()}},
                              settings=wandb.Settings(silent=True, console="off"))
        if not self.resumed:
            self._remember()
        verb = "continuing W&B run" if self.resumed else "W&B run"
        return f"{verb} {self.run_id} ({self.mode}, project {self.project!r}, files in {self.run_dir / 'wandb'})"

    def logged_steps(self) -> dict[str, int]:
        """The last step of each metric the run's earlier offline files hold ({} for a new or online run)."""
        if not self.resumed or self.mode != "offline":
            return {}
        high = wandb_files.last_steps(self.run_dir / "wandb", self.run_id)
        self.last_step = max(high.values(), default=0)
        return high

    def log(self, metrics: Sequence[tuple[str, float, int, int]]) -> None:
        """Rows by step, in order. W&B has one step axis per run and drops a step lower than its last, so
        system samples (counted per host) join the latest training step, and a row that would go back is left
        out; `summary/*` goes to the run's summary."""
        rows: dict[int, dict[str, float]] = {}
        for name, value, step, _ in metrics:
            if name.startswith(SUMMARY):
                self.run.summary[name[len(SUMMARY):]] = value
                continue
            at = self.last_step if name.startswith(SYSTEM) else step
            if at >= self.last_step:
                rows.setdefault(at, {})[name] = value
        for step in sorted(rows):
            self.run.log(rows[step], step=step)
            self.last_step = step

    def give_back_environ(self) -> None:
        """Nothing to give back: hvdtrain passes W&B's settings to wandb.init(), not through os.environ."""

    def close(self, artifacts: Sequence[Path], status: str) -> None:
        import wandb

        if artifacts:
            files = wandb.Artifact(f"{self.run_dir.name}-files", type="run-files")
            for path in artifacts:
                files.add_file(str(path))
            self.run.log_artifact(files)
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)

    def _remember(self) -> None:
        path = self.run_dir / RUN_FILE
        tmp = path.with_name(f".{RUN_FILE}.tmp")
        tmp.write_text(json.dumps({"tracker": "wandb", "run_id": self.run_id, "project": self.project,
                                   "mode": self.mode, "created": time.time()}, indent=2) + "\n")
        os.replace(tmp, path)
