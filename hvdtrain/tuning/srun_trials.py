"""`hvdtrain tune --launcher srun`: a study inside one Slurm allocation, each trial a job step.

The tune process runs in the batch shell; every trial is `srun --ntasks NP` with its workers started by
Slurm (PMIx for MPI, hvdtrain's Gloo-over-srun variables for Gloo), as examples/cluster/slurm.sbatch starts
a training. The study lives in `--dir/slurm-<job id>`, which a requeue keeps: the requeued batch script runs
the same command, finds the same journal and goes on with the same study. Pure functions of the settings and
the environment, so they are tested without Slurm.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from hvdtrain.cluster.slurm_requeue import run_name
from hvdtrain.errors import ConfigError
from hvdtrain.tuning.train_fn import trial_program
from hvdtrain.tuning.tune_settings import TuneSettings


def in_allocation(settings: TuneSettings, env: Mapping[str, str]) -> TuneSettings:
    """`settings` with the study folder made stable across a requeue: `DIR/slurm-<job id>`.

    Raises:
        ConfigError: not inside a Slurm job, or an option srun cannot honour.
    Example:
        >>> in_allocation(TuneSettings(trials=3, launcher="srun"), {"SLURM_JOB_ID": "42"}).dir
        'tune/slurm-42'
    """
    name = run_name(env)
    if not name:
        raise ConfigError("tune: --launcher srun runs each trial as a job step of a Slurm allocation: run it "
                          "inside one (sbatch examples/cluster/tune.sbatch ...), or drop --launcher srun")
    if settings.mode != "job":
        raise ConfigError("tune: --launcher srun is for --mode job; for inprocess, start the workers with "
                          "srun yourself (srun --mpi=pmix python -m hvdtrain tune --mode inprocess ...)")
    if settings.hosts:
        raise ConfigError(f"tune: --hosts {settings.hosts!r} is for horovodrun; under --launcher srun the "
                          "trials run on the allocation's nodes: drop --hosts")
    if settings.parallel != 1:
        raise ConfigError(f"tune: --launcher srun runs one trial at a time (got --parallel {settings.parallel}): "
                          "drop --parallel, or give each trial all of the allocation's tasks with --np")
    folder = Path(settings.dir)
    if folder.name != name:   # already nested (a Python caller passing the result back): leave it
        folder = folder / name
    return dataclasses.replace(settings, dir=str(folder))


def srun_command(config_file: Path, settings: TuneSettings) -> list[str]:
    """One trial as a job step: `srun --ntasks NP --mpi=pmix|none ... python -m hvdtrain --config FILE` (with a
    train_fn, its worker program: train_fn.trial_program).

    Example:
        >>> srun_command(Path("t/trial-0001.yaml"), TuneSettings(trials=2, np=2, backend="mpi"))[:3]
        ['srun', '--ntasks=2', '--mpi=pmix']
    """
    # --mpi=none: no MPI in the step, so hvdtrain gives each task Horovod's Gloo variables from SLURM_*.
    mpi = "pmix" if settings.backend == "mpi" else "none"
    # --kill-on-bad-exit: a crashing worker ends the step at once instead of leaving the others in a collective.
    return ["srun", f"--ntasks={settings.np}", f"--mpi={mpi}", "--kill-on-bad-exit=1",
            f"--job-name={config_file.stem}", *trial_program(config_file, settings.train_fn)]


def step_env(env: Mapping[str, str]) -> dict[str, str]:
    """What srun needs beyond the batch shell's environment: Slurm 22.05+ no longer passes sbatch's
    --cpus-per-task on to srun, which would bind each worker to one CPU where the site binds tasks."""
    cpus = env.get("SLURM_CPUS_PER_TASK", "")
    return {"SRUN_CPUS_PER_TASK": cpus} if cpus and "SRUN_CPUS_PER_TASK" not in env else {}
