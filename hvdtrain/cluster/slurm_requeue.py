"""Defaults a Slurm job gives a run: a name that survives a requeue, and `--resume auto` once requeued. Applied to
the first run of a process, `python -m hvdtrain`'s or a script's Trainer alike, by train/run_start.py.

A requeued job (`sbatch --requeue`, `scontrol requeue`, a pre-emption with PreemptMode=REQUEUE) runs its
batch script again with the same SLURM_JOB_ID and SLURM_RESTART_COUNT one higher. With these defaults the
second run finds the first one's folder and checkpoint by itself: no user action between the two.
Pure functions of the environment, so they are tested without Slurm.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hvdtrain.config.train_config import TrainConfig


def run_name(env: Mapping[str, str]) -> str:
    """`slurm-<job id>` inside a Slurm job (`slurm-<array job>_<task>` for an array task), else ''.

    Example:
        >>> run_name({"SLURM_JOB_ID": "4242"}), run_name({})
        ('slurm-4242', '')
    """
    array, task = env.get("SLURM_ARRAY_JOB_ID", "").strip(), env.get("SLURM_ARRAY_TASK_ID", "").strip()
    if array and task:
        return f"slurm-{array}_{task}"
    job = env.get("SLURM_JOB_ID", "").strip()
    return f"slurm-{job}" if job else ""


def restarts(env: Mapping[str, str]) -> int:
    """How many times Slurm requeued this job (SLURM_RESTART_COUNT; 0 when unset or not a number)."""
    text = env.get("SLURM_RESTART_COUNT", "").strip()
    return int(text) if text.isdigit() else 0


def requeue_defaults(env: Mapping[str, str], given: set[str]) -> tuple[dict[str, str], str]:
    """The config defaults a Slurm job implies for the keys the user did not give, and one line saying so.

    Args:
        env: the process environment (every task of a job sees the same SLURM_JOB_ID and restart count).
        given: config keys set by the user (YAML file or command line); those are never overridden.
    Returns:
        ({"name": "slurm-<id>"} when no name was given, plus {"resume": "auto"} once the job was requeued),
        and the note for the console ('' when nothing applies).

    Example:
        >>> requeue_defaults({"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1"}, set())[0]
        {'name': 'slurm-7', 'resume': 'auto'}
    """
    name = run_name(env)
    if not name:
        return {}, ""
    defaults: dict[str, str] = {}
    if "name" not in given:
        defaults["name"] = name
    count = restarts(env)
    if count and "resume" not in given:
        defaults["resume"] = "auto"
    if not defaults:
        return {}, ""
    flags = " ".join(f"--{key} {value}" for key, value in defaults.items())
    why = f"Slurm job {env.get('SLURM_JOB_ID', '').strip()}" + (f", requeued {count} time(s)" if count else "")
    return defaults, f"{why}: {flags} (the defaults under Slurm; give a name or resume of your own to choose)"


def with_requeue_defaults(config: TrainConfig, given: set[str], env: Mapping[str, str]) -> tuple[TrainConfig, str]:
    """`config` with requeue_defaults() applied (validated again), and the note; unchanged where the run writes
    nothing (run_dir ''), as there is then nothing to find after a requeue."""
    defaults, note = requeue_defaults(env, given)
    if not defaults or not config.run_dir:
        return config, ""
    return dataclasses.replace(config, name=defaults.get("name", config.name),
                               resume=defaults.get("resume", config.resume)), note
