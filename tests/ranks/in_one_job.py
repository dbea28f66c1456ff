"""Rank-side: several rank scripts run one after another in one Horovod job, so one launch (horovodrun, its workers'
start and Horovod's rendezvous: most of a small rank script's cost) serves the tests of all of them.

    python tests/ranks/in_one_job.py [NAME=VALUE ...] SCRIPT ARG ... [-- [NAME=VALUE ...] SCRIPT ARG ...] ...

Each part runs as `python SCRIPT ARG ...` (or `python -m MODULE ARG ...`, SCRIPT being `-m MODULE`) would: as
__main__, with the same sys.argv, an exit status of 0 going on to the next part; with NAME=VALUE set in os.environ
for it (and given back after it). Horovod is started once: the scripts' runtime.shutdown() calls wait
for the last part, since MPI cannot start again in a process after MPI_Finalize.
"""
from __future__ import annotations

import os
import runpy
import sys

from hvdtrain.distributed import runtime


def parts(argv: list[str]) -> list[tuple[dict[str, str], list[str]]]:
    found, current = [], []
    for arg in [*argv, "--"]:
        if arg != "--":
            current.append(arg)
            continue
        env = {}
        while current and "=" in current[0] and not current[0].endswith(".py") and current[0] != "-m":
            name, _, value = current.pop(0).partition("=")
            env[name] = value
        if current:
            found.append((env, current))
        current = []
    return found


shutdown = runtime.shutdown
runtime.shutdown = lambda: None
for env, argv in parts(sys.argv[1:]):
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as done:
        if done.code not in (None, 0):
            raise
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
shutdown()
