"""Mode `job`: every trial is its own `horovodrun -np M` job, K at a time, watched through its metrics.jsonl.

A crashing trial takes only its own job down. After each epoch the trial's held-out metric (from the
run's metrics.jsonl) is reported to Optuna; when the pruner says stop, the trial's horovodrun gets
SIGTERM, which it passes to its workers; they agree to stop at their next log interval (within the
epoch) and exit 143. The trial is recorded as pruned at that epoch.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from hvdtrain.config.train_config import TrainConfig, to_yaml
from hvdtrain.errors import ConfigError
from hvdtrain.launcher.grace import GRACE_ENV
from hvdtrain.launcher.horovodrun import horovodrun, remove_quietly, worker_env
from hvdtrain.tracking.study_run import StudyRun
from hvdtrain.train.lr_schedule import scaled_lr
from hvdtrain.tuning.devices import trial_gpus, visible_gpus, workers_per_host
from hvdtrain.tuning.space import Param, trial_config
from hvdtrain.tuning.srun_trials import srun_command, step_env
from hvdtrain.tuning.study import Study, stop_leftover_job
from hvdtrain.tuning.study_report import Progress
from hvdtrain.tuning.train_fn import trial_program, worker_import_path
from hvdtrain.tuning.tune_settings import TuneSettings

POLL_S = 0.2
STOPPED = (128 + signal.SIGTERM, 128 + signal.SIGUSR1)   # a worker's exit after a stop signal and its checkpoint


@dataclass
class Job:
    """One trial's running horovodrun and what has been read of its metrics so far."""
    trial: Any                      # optuna.Trial
    config: TrainConfig
    proc: subprocess.Popen
    log: IO[bytes]
    started: float
    offset: int = 0                 # bytes of metrics.jsonl consumed
    partial: bytes = b""            # a line still being written
    reported: list[int] = field(default_factory=list)
    pruned_at: int | None = None    # epoch (0-based) after which the pruner stopped it
    term_sent: float = 0.0
    slot: int = 0                   # which of the --parallel GPU slices it holds

    @property
    def run_path(self) -> Path:
        return Path(self.config.run_dir) / self.config.name


def job_command(config_file: Path, settings: TuneSettings) -> list[str]:
    """The trial's launch command: `horovodrun -np M -H HOSTS --gloo ... python -m hvdtrain --config FILE`
    (with a train_fn, its worker program: train_fn.trial_program), or with --launcher srun a job step of this
    Slurm allocation (hvdtrain/tuning/srun_trials.py)."""
    if settings.launcher == "srun":
        return srun_command(config_file, settings)
    hosts = settings.hosts or f"localhost:{settings.np}"
    # Over Gloo horovodrun itself stops the workers: through launcher/grace.py they get the trial's --grace-s
    # (job_env) after SIGTERM to write their stop checkpoint and exit, not Horovod's 5 s (a pruned trial's
    # workers were SIGKILLed mid-exit on a loaded machine), and a stop without the races of Horovod's own.
    launcher = [sys.executable, "-m", "hvdtrain.launcher.grace"] if _graced(settings) else [horovodrun()]
    command = [*launcher, "-np", str(settings.np), "-H", hosts, f"--{settings.backend}",
               "--start-timeout", "120", "--disable-cache"]
    if hosts.startswith("localhost:"):
        command += ["--network-interfaces", "lo"]   # Horovod: one machine, talk over loopback
    return [*command, *trial_program(config_file, settings.train_fn)]


def _graced(settings: TuneSettings) -> bool:
    """Whether job_command starts horovodrun through launcher/grace.py (Gloo); with --mpi horovodrun exec()s
    mpirun, and srun steps have Slurm's own rules after SIGTERM."""
    return settings.launcher != "srun" and settings.backend == "gloo"


def job_env(settings: TuneSettings) -> dict[str, str]:
    """What job_command's launcher reads: for launcher/grace.py, the workers' grace after SIGTERM in whole seconds
    (>= 1). Nothing else reads it (mpirun, srun and the workers don't): other trials get nothing."""
    return {GRACE_ENV: str(max(1, int(settings.grace_s)))} if _graced(settings) else {}


def run_jobs(study: Study, space: dict[str, Param], base: TrainConfig, progress: Progress,
             tracked: StudyRun | None = None) -> None:
    """Run trials as jobs until the study holds settings.trials finished ones (or too many failed).

    Args:
        study: the open study; base: the config every trial starts from; progress: where lines go;
        tracked: the study's MLflow run, which each trial's run nests under (None: untracked).
    """
    settings = study.settings
    # Credentials reach the workers in a 0600 file beside the trials' run dirs, never on a command line; the
    # study's store URI is split with them (one with a password is a credential).
    found = {**os.environ, **(tracked.env if tracked else {}), **step_env(os.environ)}
    env, secrets_file, _ = worker_env({**found, **worker_import_path(settings.train_fn, os.environ)},
                                      Path(settings.dir).resolve())
    try:
        _run_all(study, space, base, progress, env, tracked)
    finally:
        remove_quietly(secrets_file)


def _run_all(study: Study, space: dict[str, Param], base: TrainConfig, progress: Progress,
             env: dict[str, str], tracked: StudyRun | None) -> None:
    settings = study.settings
    running: list[Job] = []
    failures = 0
    # Each concurrent trial gets its own GPUs (CUDA_VISIBLE_DEVICES); checked once, before any trial starts.
    visible = [] if base.device == "cpu" else visible_gpus(os.environ, _gpu_count())
    per_trial = workers_per_host(settings.np, settings.hosts) * base.stages
    trial_gpus(0, settings.parallel, per_trial, visible)
    try:
        while True:
            while (len(running) < settings.parallel and study.remaining() > len(running)
                   and failures < settings.failure_limit):
                slot = min(set(range(settings.parallel)) - {job.slot for job in running})
                job = _start(study, space, base, env, trial_gpus(slot, settings.parallel, per_trial, visible))
                if job is None:
                    failures += 1
                    progress.trial_done(study, study.optuna.trials[-1])
                else:
                    job.slot = slot
                    running.append(job)
            if not running:
                break
            time.sleep(POLL_S)
            for job in list(running):
                _watch(job, study, settings)
                if job.proc.poll() is None:
                    continue
                _watch(job, study, settings)   # the last lines, written just before exit
                running.remove(job)
                failures += not _finish(job, study, settings)
                if tracked:
                    tracked.trial_done(study.optuna.trials[job.trial.number], job.run_path)
                progress.trial_done(study, study.optuna.trials[job.trial.number])
    except BaseException:    # Ctrl-C or an error here: stop our jobs, record them, then let it propagate
        for job in running:
            _stop(job, signal.SIGTERM)
        for job in running:
            _wait_or_kill(job, settings.grace_s)
            study.interrupted(job.trial, "the tune process was stopped while this trial ran")
        raise


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _start(study: Study, space: dict[str, Param], base: TrainConfig, env: dict[str, str],
           gpus: str | None) -> Job | None:
    settings = study.settings
    folder = Path(settings.dir).resolve() / "trials"
    folder.mkdir(parents=True, exist_ok=True)
    # K trials of M workers share this host: give each worker its share of the cores unless the config says.
    threads = base.threads or max(1, (os.cpu_count() or 1) // (settings.np * settings.parallel))
    scale = scaled_lr(1.0, settings.np, base.lr_scaling)
    trial = study.ask(space, {"mode": "job", "world_size": settings.np, "lr_scaling": base.lr_scaling,
                              "lr_scale": scale, **({"train_fn": settings.train_fn} if settings.train_fn else {})})
    name = f"trial-{trial.number:04d}"
    try:
        config = trial_config(base, trial.params, run_dir=str(folder), name=name, threads=threads)
    except ConfigError as err:
        study.fail(trial, f"invalid config: {err}")
        return None
    # The LR rule is the trainer's (applied per world size); recorded here so the table shows what ran.
    trial.set_user_attr("lr_effective", config.lr * scale)
    config_file = folder / f"{name}.yaml"
    config_file.write_text(to_yaml(config))
    log_file = folder / f"{name}.log"
    log = log_file.open("wb")
    proc = subprocess.Popen(job_command(config_file, settings), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent,
                            env=dict(env, PYTHONUNBUFFERED="1", **job_env(settings),
                                     **({"CUDA_VISIBLE_DEVICES": gpus} if gpus else {})))
    # What a later run needs to stop this job should this process die (the config path marks it as ours).
    trial.set_user_attr("job_pid", proc.pid)
    trial.set_user_attr("job_config", str(config_file))
    trial.set_user_attr("run_dir", str(folder / name))
    trial.set_user_attr("log", str(log_file))
    if gpus:
        trial.set_user_attr("gpus", gpus)
    return Job(trial, config, proc, log, time.monotonic())


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the tune process dies, even by kill -9."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _watch(job: Job, study: Study, settings: TuneSettings) -> None:
    """Report the epochs the trial finished since last time; SIGTERM its job if the pruner says so."""
    metrics = job.run_path / "metrics.jsonl"
    try:
        with metrics.open("rb") as handle:
            handle.seek(job.offset)
            chunk = handle.read()
    except FileNotFoundError:
        return
    job.offset += len(chunk)
    *lines, job.partial = (job.partial + chunk).split(b"\n")
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        value, epoch = record.get(settings.metric), record.get("epoch")
        if record.get("kind") != "epoch" or value is None or epoch in job.reported:
            continue
        job.trial.report(value, epoch)
        job.reported.append(epoch)
        last_epoch = epoch + 1 >= job.config.epochs
        if job.pruned_at is None and not last_epoch and bool(job.trial.should_prune()):
            job.pruned_at = epoch
            _stop(job, signal.SIGTERM)
    if job.term_sent and job.proc.poll() is None and time.monotonic() - job.term_sent > settings.grace_s:
        _stop(job, signal.SIGKILL)


def _stop(job: Job, sig: int) -> None:
    job.term_sent = job.term_sent or time.monotonic()
    try:
        os.killpg(job.proc.pid, sig)   # horovodrun's group; horovodrun passes SIGTERM on to its workers
    except ProcessLookupError:
        pass
    if sig == signal.SIGKILL:   # workers run in sessions of their own: take the whole tree
        stop_leftover_job(job.proc.pid, str(job.trial.user_attrs.get("job_config", "")))


def _wait_or_kill(job: Job, grace_s: float) -> None:
    try:
        job.proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _stop(job, signal.SIGKILL)
        job.proc.wait()
    job.log.close()


def _finish(job: Job, study: Study, settings: TuneSettings) -> bool:
    """Record the ended job's outcome; False when the trial failed."""
    job.log.close()
    trial, code = job.trial, job.proc.returncode
    trial.set_user_attr("duration_s", round(time.monotonic() - job.started, 2))
    trial.set_user_attr("exit_code", code)
    if job.pruned_at is not None:
        trial.set_user_attr("pruned_at_epoch", job.pruned_at)
        study.optuna.tell(trial, state=_pruned())
        return True
    if code == 0:
        summary = job.run_path / "summary.json"
        value = json.loads(summary.read_text()).get(settings.metric) if summary.exists() else None
        if value is not None:
            study.optuna.tell(trial, value)
            return True
        study.fail(trial, f"the job ended without a {settings.metric} in {summary}")
        return False
    why = error_line(Path(trial.user_attrs["log"]))
    if code in STOPPED and why.startswith("hvdtrain: stopped by SIG"):
        # Its workers were told to stop (a pre-emption's TERM, Slurm's early warning) and wrote a checkpoint:
        # not the trial's fault. Its parameters run again from the start, which with the same seed is the
        # same training; the tune process, if it was stopped too, ends before starting that run. (A crash
        # can end in 143 too, srun's --kill-on-bad-exit TERMs the other workers: its error line says so.)
        study.interrupted(trial, f"its job was stopped (exit {code}: {why})")
        return True
    study.fail(trial, f"exit {code}: {why}")
    return False


def _pruned() -> Any:
    from optuna.trial import TrialState

    return TrialState.PRUNED


def error_line(log: Path) -> str:
    """The line of a trial's log that says what went wrong (a worker's `hvdtrain: error`, else the last line)."""
    try:
        lines = [line.split(">:", 1)[-1].strip() for line in log.read_text(errors="replace").splitlines()]
    except OSError:
        return "no log"
    lines = [line for line in lines if line]
    for line in lines:
        if line.startswith("hvdtrain: error") or line.startswith("hvdtrain: rank"):
            return line
    for line in lines:
        if line.startswith("hvdtrain: stopped by SIG"):
            return line
    return lines[-1] if lines else "no output"
