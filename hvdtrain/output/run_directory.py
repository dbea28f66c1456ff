"""The run directory as one component: rank 0's claim on the folder (its lock), the RunLog and its tracker, and
the other hosts' system sampling for that tracker. A context manager; `close()` ends all it started.

Rank 0 decides (`decide`), every rank adopts the same `Verdict` (a small picklable dataclass the Trainer
broadcasts, or an elastic job's state carries), so no rank waits alone and nothing is written before every
input check passed. `hvdtrain.fit` decides before the data loads and hands the same object to its Trainer.
"""
from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.errors import UserError
from hvdtrain.output.claim import Claim, Handover, claim, claim_new
from hvdtrain.output.console import console
from hvdtrain.output.run_log import RunLog
from hvdtrain.tracking import system


class ModelRecord(Protocol):
    """How to rebuild a model not built from the config (models/recipe.py's ModelRecipe), as the folder sees it."""

    @property
    def cls(self) -> str: ...      # "module:qualname" of the model's class

    @property
    def name(self) -> str: ...     # the class name, lowercased: the run's name starts with it

    def write(self, folder: str | Path) -> None: ...   # model.json


@dataclass(frozen=True)
class RunDirSettings:
    """What the run directory reads of the config."""

    run_dir: str            # parent folder; '' writes nothing
    name: str               # the folder's name; '' = stem + timestamp
    resume: str             # a resume continues the run found in the folder, a fresh run needs it empty
    stem: str               # model-dataset, for a generated name (the class's name for a model not built from it)
    tracking: str           # decides whether other hosts sample their CPU/memory for rank 0's tracker
    elastic: bool           # hosts change mid-run: rank 0's host alone is sampled
    record: TrainConfig     # written whole to config.yaml and the tracker's params; decides nothing here
    model: ModelRecord | None = None   # a model not built from the config: model.json says how to rebuild it

    @classmethod
    def of(cls, config: TrainConfig) -> RunDirSettings:
        return cls(config.run_dir, config.name, config.resume, f"{config.model}-{config.dataset}", config.tracking,
                   config.elastic, config)


@dataclass(frozen=True)
class Verdict:
    """Rank 0's decision on the run folder, the same on every rank."""

    path: str | None = None
    error: str | None = None
    job: str = ""               # in the lock file: a later rank 0 of an elastic job knows its own job's lock by it
    system_hosts: bool = False  # the other hosts sample their CPU/memory for rank 0's tracker


class RunDirectory:
    """Args:
        settings: RunDirSettings.of(config).
    Example:
        >>> with RunDirectory(RunDirSettings.of(config)) as run:   # doctest: +SKIP
        ...     verdict = run.decide()
    """

    def __init__(self, settings: RunDirSettings) -> None:
        self.settings = settings
        self.verdict: Verdict | None = None
        self.log: RunLog | None = None
        self._claim: Claim | None = None
        self._handover: Handover | None = None
        self._host_sampler: system.SystemSampler | None = None
        self._announced = False

    def record(self, config: TrainConfig, model: ModelRecord | None = None) -> None:
        """The config its files record (the Trainer's: a user's DataLoader may have set the batch size), and, for a
        model not built from `config.model`, how to rebuild it: written to model.json, its class in config.yaml's
        `model`, its class name leading the run's name (`widemlp-digits-...`, not `cnn-digits-...`)."""
        stem = f"{model.name if model else config.model}-{config.dataset}"
        if model is not None:
            config = dataclasses.replace(config, model=model.cls)
        self.settings = dataclasses.replace(self.settings, record=config, model=model, stem=stem)

    @property
    def path(self) -> str | None:
        return self.verdict.path if self.verdict else None

    def decide(self) -> Verdict:
        """Rank 0: claim runs/<name> (see output/claim.py), or say why not; once (a claim made before the data
        loaded is kept). The error, if any, is in the verdict for every rank to raise."""
        if self.verdict is None:
            self.verdict = self._claim_folder()
        return self.verdict

    def _claim_folder(self) -> Verdict:
        s = self.settings
        if not s.run_dir:
            return Verdict()
        job = secrets.token_hex(8)
        try:
            if s.name:
                held = claim(Path(s.run_dir) / s.name, fresh=not s.resume, job=job)
            else:
                stem = f"{s.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
                held = claim_new(s.run_dir, stem.replace(":", "_").replace("/", "_"), job=job)
        except UserError as err:
            return Verdict(error=str(err))
        self._claim = held
        return Verdict(str(held.path), job=job, system_hosts=not s.elastic and system.gathered(s.tracking))

    def adopt(self, verdict: Verdict, *, is_root: bool) -> None:
        """Every rank: rank 0's verdict (raises its refusal). The other hosts' samplers start here for rank 0's
        tracker (rank 0's own host is sampled by that tracker)."""
        if verdict.error:
            raise UserError(verdict.error)
        self.verdict = verdict
        if verdict.system_hosts and not is_root and self._host_sampler is None:
            self._host_sampler = system.start()   # None unless this is its host's local rank 0

    def hold(self, is_root: bool) -> str | None:
        """An elastic job, on every (re)start: the folder stays this job's whichever process is rank 0 now; a
        rank 0 without a claim of its own takes the job's lock over. Returns the refusal, if another run took it."""
        if not is_root or self._claim is not None or self._handover is not None or not self.verdict:
            return None
        handover = Handover(self.verdict.path or "", self.verdict.job)
        try:
            handover.take()
        except UserError as err:
            return str(err)
        self._handover = handover
        return None

    def announce(self, banner: Callable[[], list[str]], resumed: str | None, *, backend: str, device: str,
                 branch_from: int | None) -> None:
        """Rank 0: the run's files and tracker, the banner and the resume line; once per process (an elastic
        job's restarts call again). `branch_from`: the step a resume that may log other values starts at."""
        if self._announced:
            return
        self._announced = True
        self.open_log(backend=backend, device=device, branch_from=branch_from)
        console.banner(banner())
        if resumed:
            console.line(f"hvdtrain: {resumed}")

    def open_log(self, *, backend: str, device: str, branch_from: int | None) -> RunLog | None:
        """Rank 0: the run's files and tracker, once per process."""
        if self.log is None and self.path:
            self.log = RunLog(self.path, self.settings.record, backend=backend, device=device,
                              branch_from=branch_from)
            if self.settings.model is not None:
                self.settings.model.write(self.path)
        return self.log

    def host_samples(self) -> list[Any]:
        """This host's system samples since the last call, for rank 0's tracker."""
        return self._host_sampler.drain() if self._host_sampler else []

    def record_system(self, samples: list[Any]) -> None:
        if self.log and self.log.tracker:
            self.log.tracker.record_system(samples)

    def close(self) -> None:
        """Stop the samplers and give the folder back; the run's files stay."""
        if self._host_sampler is not None:
            self._host_sampler.stop()
            self._host_sampler = None
        if self.log is not None:
            self.log.close()
        for held in (self._handover, self._claim):
            if held is not None:
                held.release()
        self._handover = self._claim = None

    @contextmanager
    def closed_on_error(self, *, owned: bool) -> Iterator[None]:
        """Close it if the block raises and it is `owned` (made by the one who opens it, not handed in)."""
        try:
            yield
        except BaseException:
            if owned:
                self.close()
            raise

    def __enter__(self) -> RunDirectory:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
