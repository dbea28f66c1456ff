"""The background thread between rank 0's training loop and a tracker, and `start()`, which picks one.

The training thread never waits on the tracker: `record()` puts on an unbounded queue and returns. The
thread sends whatever has piled up in one batch, so a slow server means fewer, larger calls, not a slower
step. The first failure (no server, bad URI, a server that dies mid-run) is one warning; from then on
records are dropped and training goes on. `finish()` waits at most FLUSH_S for the last batch and the
artifacts, then leaves the thread behind (a daemon: it cannot keep the process alive). A resumed run does not
log the steps it already holds again, unless the resume may change them (a rollback): then the new branch goes
to a new run linked to the old one (Tracker._branch).
"""
from __future__ import annotations

import atexit
import importlib.util
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.environment import process
from hvdtrain.environment.credentials import redact
from hvdtrain.errors import first_line
from hvdtrain.tracking import context
from hvdtrain.tracking.mlflow_sink import RUN_FILE, MlflowSink
from hvdtrain.tracking.wandb_sink import WandbSink

# The end of a run waits this long for the tracker (the last metrics and the artifact upload).
FLUSH_S = 60.0
# A process that ends without finish() (an error, a signal) closes its run this much faster. Long enough for
# a run still being opened to open first: a tune trial pruned (SIGTERM) within its first epoch on a loaded
# machine was gone before MLflow's import and store had opened its run at 10 s, so the study lost the trial.
ABANDON_S = 30.0
# Sends are at least this far apart: a store's cost is mostly per call (an embedded sqlite log_batch of 4
# metrics costs ~5 ms of CPU, one of 40 ~20 ms), and that CPU is taken from the training ranks on a full
# machine. The end of a run does not wait for it.
SEND_EVERY_S = 2.0
# What a finished run uploads, the first existing file of each group (safetensors before pickle).
ARTIFACTS = (("config.yaml",), ("summary.json",), ("metrics.jsonl",), ("curves.png",),
             ("model.safetensors", "model.pt"), ("best.safetensors", "best.pt"))


class Sink(Protocol):
    @property
    def where(self) -> str: ...

    def open(self, params: Mapping[str, str], tags: Mapping[str, str]) -> str: ...

    def log(self, metrics: list[tuple[str, float, int, int]]) -> None: ...

    def close(self, artifacts: list[Path], status: str) -> None: ...

    def logged_steps(self) -> dict[str, int]: ...

    def give_back_environ(self) -> None: ...   # what open() set in os.environ, as it found it (close() does too)

    @property
    def run_id(self) -> str: ...


class Tracker:
    """Rank 0's one tracked run. Call `record()` per metrics record and `finish()` once at the end."""

    def __init__(self, sink: Sink, params: Mapping[str, str], tags: Mapping[str, str],
                 say: Callable[[str], None], warn: Callable[[str], None], *, run_dir: Path | None = None,
                 branch_from: int | None = None) -> None:
        self.sink = sink
        self.run_dir = run_dir
        self.branch_from = branch_from
        self.say = say
        # A sink's error can quote its URI, password and all: every warning line is redacted.
        self.warn: Callable[[str], None] = lambda line: warn(redact(line))
        self.failed = False
        self.queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.closing = threading.Event()    # cuts the pause between sends short: the run is ending
        self.thread = threading.Thread(target=self._work, args=(dict(params), dict(tags)),
                                       name="hvdtrain-tracking", daemon=True)
        self.thread.start()
        atexit.register(self._abandon)

    def record(self, record: Mapping[str, Any]) -> None:
        """A metrics.jsonl record (train, epoch or summary): queued, never waited for."""
        if self.failed:
            return
        step, values = context.metrics(record)
        stamp = int(time.time() * 1000)
        self.queue.put(("metrics", [(name, value, step, stamp) for name, value in values.items()]))

    def record_system(self, samples: list[tuple[str, float, int, int]]) -> None:
        """System metrics, (name, value, step, unix ms) each, from tracking/system.py: queued, never waited for."""
        if not self.failed and samples:
            self.queue.put(("system", list(samples)))

    def finish(self, run_dir: Path, status: str = "FINISHED", wait_s: float = FLUSH_S) -> None:
        """Send what is left and the run folder's files, then end the run; waits at most `wait_s`."""
        atexit.unregister(self._abandon)
        self.closing.set()
        files = [next(run_dir / name for name in group if (run_dir / name).exists())
                 for group in ARTIFACTS if any((run_dir / name).exists() for name in group)]
        self.queue.put(("close", (files, status)))
        self.thread.join(wait_s)
        if self.thread.is_alive() and not self.failed:
            self.failed = True
            self.warn(f"tracking: {self.sink.where} did not take the run's last records and files within "
                      f"{wait_s:.0f} s; they are in {run_dir}, and training is done")

    def _abandon(self) -> None:
        """At exit without finish(): the run is marked KILLED (a resume continues it), within ABANDON_S."""
        self.queue.put(("close", ([], "KILLED")))
        self.closing.set()
        self.thread.join(ABANDON_S)

    def _work(self, params: dict[str, str], tags: dict[str, str]) -> None:
        try:
            said = self.sink.open(params, tags)
            # A resumed run already holds its first process's metrics, up to the kill: the steps redone since
            # the last checkpoint are not logged twice, and each sampler's count (from 0 in every process)
            # follows on from the last one's.
            high = self.sink.logged_steps()
            if self.branch_from is not None and max(high.values(), default=-1) > self.branch_from:
                said, high = self._branch(params, tags, self.branch_from), {}
            self.say(f"tracking: {said}")
        except Exception as err:  # any failure of a tracker is its own, never the training's
            self._fail(f"cannot log to {self.sink.where} ({first_line(err)})")
            return
        while True:
            batch = [self.queue.get()]
            while True:  # everything that piled up while the last call was in flight, in one call
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            metrics = [(name, value, step, stamp) for kind, item in batch if kind == "metrics"
                       for name, value, step, stamp in item if step > high.get(name, -1)]
            metrics += [(name, value, step + high.get(name, -1) + 1, stamp) for kind, item in batch
                        if kind == "system" for name, value, step, stamp in item]
            closing = next((item for kind, item in batch if kind == "close"), None)
            try:
                if metrics:
                    self.sink.log(metrics)
                if closing is not None:
                    self.sink.close(*closing)
                    return
            except Exception as err:
                self._fail(f"lost {self.sink.where} ({first_line(err)})")
                return
            self.closing.wait(SEND_EVERY_S)   # what arrives meanwhile goes in the next call

    def _branch(self, params: dict[str, str], tags: dict[str, str], step: int) -> str:
        """A resume below the steps the run already logged, whose values may differ (a rollback, another LR):
        the old run keeps the abandoned branch; a new one, tagged hvdtrain.branch = '<old run>@<step>' (in MLflow
        nested under the old one), gets this branch from `step` on. <run>/tracking.json names the new one, so a
        later crash-resume continues it without duplicate steps."""
        old = self.sink.run_id
        self.sink.close([], "FINISHED")
        if self.run_dir is not None:
            (self.run_dir / RUN_FILE).unlink(missing_ok=True)
        tags = {**tags, "hvdtrain.branch": f"{old}@{step}"}
        tags.setdefault("mlflow.parentRunId", old)     # a tune trial stays under its study: the tag links it
        said = self.sink.open(params, tags)
        return f"resumed at step {step}, below the steps run {old} logged: a new branch, {said}"

    def _fail(self, why: str) -> None:
        self.failed = True
        self.sink.give_back_environ()   # no more requests
        self.warn(f"tracking: {why}; training goes on untracked, its files are whole in the run folder")


def start(run_dir: Path, config: TrainConfig, *, say: Callable[[str], None], warn: Callable[[str], None],
          backend: str = "", device: str = "", env: Mapping[str, str] | None = None,
          branch_from: int | None = None) -> Tracker | None:
    """The tracker `config.tracking` asks for, on rank 0 only; None when untracked, or after one warning.
    `branch_from`: a resume at this step may log other values than the run holds beyond it (see Tracker._branch).

    Example:
        >>> tracker = start(Path("runs/cnn-digits"), config, say=print, warn=print)  # doctest: +SKIP
    """
    env = os.environ if env is None else env
    chosen = context.resolve(config.tracking, env)
    if chosen == "none" or not process.is_rank_zero():
        return None
    if importlib.util.find_spec(chosen) is None:
        warn(f"tracking: {chosen} is not installed (pip install -e '.[tracking]' in hvdtrain's checkout); "
             "training goes on untracked")
        return None
    tags = context.tags(run_dir, config, backend=backend, device=device)
    if chosen == "wandb":  # offline into the run folder unless WANDB_MODE says otherwise
        sink: Sink = WandbSink(run_dir, config.tracking_experiment, mode=env.get("WANDB_MODE") or "offline")
    else:
        uri = env.get("MLFLOW_TRACKING_URI", "")
        sink = MlflowSink(run_dir, uri or context.embedded_store(run_dir), config.tracking_experiment,
                          embedded=not uri)
        if env.get(context.PARENT_ENV):  # a trial of `hvdtrain tune`: nested under the study's run
            tags["mlflow.parentRunId"] = env[context.PARENT_ENV]
    return Tracker(sink, context.params(config, chosen), tags, say, warn, run_dir=run_dir, branch_from=branch_from)
