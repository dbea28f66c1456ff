"""The Optuna study on disk: a journal file under the tune dir, so a crashed study resumes where it stopped.

One process drives a study at a time (a `flock` on TUNE_DIR/tune.lock, released by the kernel even after
kill -9). When it starts, any trial still RUNNING was left by a process that died: it is marked failed
("interrupted"), its leftover job (if any) is stopped, and its parameters are queued to run again.
"""
from __future__ import annotations

import fcntl
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from hvdtrain.errors import UserError
from hvdtrain.tuning.space import Param
from hvdtrain.tuning.tune_settings import TuneSettings

JOURNAL = "study.journal"
LOCK = "tune.lock"
FINISHED = ("COMPLETE", "PRUNED")
INTERRUPTED = "interrupted: "


@dataclass
class Study:
    """An open study, its lock held until close()."""
    optuna: Any                          # optuna.Study
    settings: TuneSettings
    lock: IO[str]
    recovered: list[int] = field(default_factory=list)   # trial numbers found RUNNING and failed now

    def finished(self) -> int:
        """Complete and pruned trials: what counts towards --trials."""
        return sum(1 for t in self.optuna.get_trials(deepcopy=False) if t.state.name in FINISHED)

    def remaining(self) -> int:
        return max(0, self.settings.trials - self.finished())

    def ask(self, space: dict[str, Param], attrs: dict[str, Any]) -> Any:
        """A new trial (a queued retry first) with its parameters sampled, and `attrs` recorded on it."""
        # A sampler seeded by the trial's place in the study, not by how many asks this process made: a study
        # stopped and resumed (a requeued Slurm job) proposes what the uninterrupted study would have.
        self.optuna.sampler = _sampler(self.settings, self.settings.seed + self.placed())
        trial = self.optuna.ask({key: param.distribution() for key, param in space.items()})
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        return trial

    def placed(self) -> int:
        """Trials that count as a place in the study's order: all but those an interruption failed (their
        parameters are queued again and run in the same place)."""
        return sum(1 for t in self.optuna.get_trials(deepcopy=False)
                   if not str(t.user_attrs.get("error", "")).startswith(INTERRUPTED))

    def fail(self, trial: Any, error: str) -> None:
        trial.set_user_attr("error", error)
        self.optuna.tell(trial, state=_state("FAIL"))

    def interrupted(self, trial: Any, why: str) -> None:
        """A trial cut short by a stop or crash of the study itself: failed, and queued to run again once."""
        retried = not trial.user_attrs.get("retry_of_interrupted")   # a trial that stops us twice stays failed
        self.fail(trial, f"{INTERRUPTED}{why}" + ("; queued again" if retried else ""))
        if retried:
            self.optuna.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number,
                                                                "retry_of_interrupted": True})

    def close(self) -> None:
        fcntl.flock(self.lock, fcntl.LOCK_UN)
        self.lock.close()


def _state(name: str) -> Any:
    from optuna.trial import TrialState

    return TrialState[name]


def open_study(settings: TuneSettings) -> Study:
    """Create or resume the study in settings.dir; recover trials a killed process left RUNNING.

    Args:
        settings: the study's settings (dir, name, metric direction, sampler, pruner, seed).
    Returns:
        An open Study holding the dir's lock.
    Raises:
        UserError: another process is running this study, or the study exists with the other direction.
    Example:
        >>> study = open_study(TuneSettings(trials=6, dir="tune"))
        >>> study.remaining()
        6
    """
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)   # our own line per trial instead of Optuna's
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    folder = Path(settings.dir)
    journal = folder / JOURNAL
    _refuse_another_study(journal, settings.study)   # before the lock: a refused study writes nothing
    folder.mkdir(parents=True, exist_ok=True)
    lock = _take_lock(folder / LOCK)
    stale_lock = Path(str(journal) + ".lock")
    if stale_lock.exists():
        stale_lock.unlink()   # Optuna's own write lock, left by a process killed mid-write (we hold the dir)
    storage = JournalStorage(JournalFileBackend(str(journal)))
    study = optuna.create_study(study_name=settings.study, storage=storage, sampler=_sampler(settings, settings.seed),
                                pruner=_pruner(settings), direction=settings.direction, load_if_exists=True)
    if study.direction.name.lower() != settings.direction:
        lock.close()
        raise UserError(f"study {settings.study!r} in {folder} was made to {study.direction.name.lower()}, not to "
                        f"{settings.direction} {settings.metric}; use another --dir or --study")
    opened = Study(study, settings, lock)
    opened.recovered = _recover(opened)
    return opened


def _refuse_another_study(journal: Path, name: str) -> None:
    """One study per --dir: its trials-NNNN folders, trials.json and best.yaml are not named by study."""
    if not journal.exists():
        return
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    others = sorted(s.study_name for s in JournalStorage(JournalFileBackend(str(journal))).get_all_studies()
                    if s.study_name != name)
    if others:
        raise UserError(f"tune: --dir {journal.parent} holds study {others[0]!r}, not {name!r}: use another --dir "
                        f"for a new study, or --study {others[0]} to continue that one")


def _take_lock(path: Path) -> IO[str]:
    handle = path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read().strip() or "unknown"
        handle.close()
        raise UserError(f"another hvdtrain tune is running on {path.parent} (pid {owner}); wait for it or "
                        "use another --dir") from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def _sampler(settings: TuneSettings, seed: int) -> Any:
    import optuna

    return (optuna.samplers.TPESampler(seed=seed) if settings.sampler == "tpe"
            else optuna.samplers.RandomSampler(seed=seed))


def _pruner(settings: TuneSettings) -> Any:
    import optuna

    if settings.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=settings.startup_trials,
                                           n_warmup_steps=settings.warmup_epochs)
    if settings.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, settings.warmup_epochs + 1))
    return optuna.pruners.NopPruner()


def _recover(opened: Study) -> list[int]:
    """Trials RUNNING with nobody running them: stop what is left of them, fail them, queue them again."""
    import optuna

    recovered = []
    for frozen in opened.optuna.get_trials(deepcopy=False, states=(_state("RUNNING"),)):
        stop_leftover_job(frozen.user_attrs.get("job_pid"), frozen.user_attrs.get("job_config", ""))
        opened.interrupted(optuna.trial.Trial(opened.optuna, frozen._trial_id),
                           "the tune process stopped while this trial ran")
        recovered.append(frozen.number)
    return recovered


def stop_leftover_job(pid: Any, marker: str) -> None:
    """A trial job a killed tune process left behind: stop its horovodrun and workers (only if it is ours)."""
    import psutil

    if not isinstance(pid, int) or not marker:
        return
    try:
        root = psutil.Process(pid)
        if marker not in " ".join(root.cmdline()):   # the pid was reused by something else: leave it
            return
        family = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    for member in family:
        try:
            member.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(family, timeout=10)


def trial_summary(frozen: Any) -> dict[str, Any]:
    """A finished trial as plain data (for the results table and tests)."""
    return {"number": frozen.number, "state": frozen.state.name, "value": frozen.value, "params": frozen.params,
            "epochs": len(frozen.intermediate_values), **frozen.user_attrs}


def write_trials_json(study: Study) -> Path:
    """TUNE_DIR/trials.json: every trial of the study (all invocations), for scripts and tests."""
    from hvdtrain.output.files import write_text

    rows = [trial_summary(t) for t in study.optuna.get_trials(deepcopy=False)]
    return write_text(Path(study.settings.dir) / "trials.json", json.dumps(rows, indent=1, default=str) + "\n")
