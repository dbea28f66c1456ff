"""`python -m hvdtrain.launcher.worker_start COMMAND...`: the start of every worker of `hvdtrain launch`, before the
user's command replaces it (exec: the same process, so stdin, signals and the exit code are the command's own).

`hvdtrain launch` puts this in front of the command it hands to horovodrun, so any program a worker runs (a plain
Horovod script that never imports hvdtrain, a shell script) finds:
- its credentials in the environment: the variables of the 0600 file HVDTRAIN_SECRETS_FILE names (only that path
  travels, never a value on a command line; environment/secrets_file.py), as if they had been exported on the worker;
- a share of this host's cores, unless the user set OMP_NUM_THREADS or MKL_NUM_THREADS: cores // the workers on
  this host, at least 1, in both (nothing for a worker alone on its host). Otherwise torch (OpenMP) takes every
  core in every worker, and they fight each other and Gloo's threads: issue 52 saw Horovod's
  pytorch_synthetic_benchmark.py 16x slower on 2 workers of a 2-core host. Rank 0 says so in one line, as
  torchrun does.
Leading `NAME=value` words of the command are set as env(1) sets them (the shell horovodrun runs would have).
Importing the hvdtrain package exports RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE (environment/process.py),
so the command gets them too (HVDTRAIN_EXPORT_RANK_ENV=0 leaves them alone).

`python -m hvdtrain` starts without this step: its CLI loads the file through the same take_secrets() (under plain
horovodrun too), and its Trainer sets its own threads (TrainConfig.threads).
"""
from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping, MutableMapping

from hvdtrain.environment import process
from hvdtrain.environment.credentials import leak_warning
from hvdtrain.environment.secrets_file import load_secrets_file
from hvdtrain.errors import UserError

MODULE = "hvdtrain.launcher.worker_start"
# What OpenMP (torch's intra-op pool) and MKL read; either one set by the user means the user chose.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def command_prefix() -> list[str]:
    """What `hvdtrain launch` puts in front of the worker command (this Python, at the same path on every host,
    as horovodrun's own workers need)."""
    return [sys.executable, "-m", MODULE]


def take_secrets(environ: dict[str, str] | os._Environ[str]) -> str | None:
    """Before any user code: the credentials of HVDTRAIN_SECRETS_FILE (if set) into `environ`; returns a one-line
    warning naming credentials that came on horovodrun's command line instead, or None.

    Raises UserError when the file cannot be read or parsed.
    """
    loaded = load_secrets_file(environ)
    return leak_warning(environ, loaded)


def host_cores() -> int:
    """The cores this process may run on: its CPU affinity (a cgroup cpuset, taskset, Slurm's binding), else the
    host's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity (macOS)
        return os.cpu_count() or 1


def thread_share(environ: Mapping[str, str], cores: int) -> tuple[int, int] | None:
    """(threads per worker, workers on this host) for a worker a launcher started beside others on its host, or
    None: where the user set OMP_NUM_THREADS or MKL_NUM_THREADS (theirs stand), where it is alone on its host (torch
    takes every core then anyway; torchrun leaves it alone too), or no launcher started this process.

    Example:
        >>> thread_share({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_SIZE": "2"}, cores=16)
        (8, 2)
        >>> thread_share({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, cores=2)
        (1, 4)
        >>> thread_share({"HOROVOD_RANK": "0", "OMP_NUM_THREADS": "3"}, cores=16) is None
        True
    """
    if any(environ.get(name, "").strip() for name in THREAD_ENV):
        return None
    me = process.from_env(environ)
    if me is None or me.local_size <= 1:
        return None
    return max(1, cores // me.local_size), me.local_size


def set_threads(environ: MutableMapping[str, str], cores: int) -> str | None:
    """Set THREAD_ENV in `environ` to this worker's share of `cores` unless the user set them; the line rank 0
    prints about it, or None where nothing was set."""
    share = thread_share(environ, cores)
    if share is None:
        return None
    threads, workers = share
    environ.update(dict.fromkeys(THREAD_ENV, str(threads)))
    return (f"OMP_NUM_THREADS={threads} per worker ({cores} core{'s' * (cores != 1)}, {workers} workers on this "
            "host); set it to override")


def split_assignments(command: list[str]) -> tuple[dict[str, str], list[str]]:
    """(leading NAME=value words, the rest): what env(1) and a shell take for variables of the command.

    Example:
        >>> split_assignments(["OMP_NUM_THREADS=4", "python", "train.py", "--lr=0.1"])
        ({'OMP_NUM_THREADS': '4'}, ['python', 'train.py', '--lr=0.1'])
    """
    found: dict[str, str] = {}
    for i, word in enumerate(command):
        name, sep, value = word.partition("=")
        if not sep or not name.isidentifier():
            return found, command[i:]
        found[name] = value
    return found, []


def main(argv: list[str]) -> int:
    """Prepare this worker's environment and exec `argv`; returns only when that fails (the shell's codes)."""
    assigned, command = split_assignments(argv)
    if not command:
        print(f"hvdtrain: error: usage: python -m {MODULE} [NAME=value ...] COMMAND [ARGS...]", file=sys.stderr,
              flush=True)
        return 2
    try:
        warning = take_secrets(os.environ)
    except UserError as err:
        print(f"hvdtrain: error: {err}", file=sys.stderr, flush=True)
        return 2
    os.environ.update(assigned)   # after the file: the command's own words are the more specific
    threads = set_threads(os.environ, host_cores())
    me = process.from_env(os.environ)
    if me is not None and me.is_root:   # once per job, not once per worker
        for line in (warning, threads):
            if line:
                print(f"hvdtrain: {line}", file=sys.stderr, flush=True)
    # Python ignores SIGPIPE and SIGXFSZ; an ignored signal stays ignored across exec (subprocess undoes it too).
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execvp(command[0], command)
    except OSError as err:
        print(f"hvdtrain: error: cannot run {command[0]!r} on this worker: {err.strerror}", file=sys.stderr,
              flush=True)
        return 127 if isinstance(err, FileNotFoundError) else 126
    return 0   # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
