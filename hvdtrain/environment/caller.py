"""The caller's os.environ around an in-process run: what the run set is given back when it ends.

A notebook kernel, a test runner or a Spark Python worker outlives many runs; each run sets variables for
Horovod's start and for data libraries (distributed/runtime.py `started`), and must not leave them behind.
"""
from __future__ import annotations

from collections.abc import Mapping, MutableMapping


def give_back(env: MutableMapping[str, str], before: Mapping[str, str], started: Mapping[str, str]) -> list[str]:
    """Undo what a run set in `env`: every variable whose value in `started` (the environment once the run had
    started) differs from `before` gets its `before` value back, or is removed where `before` had none. A
    variable changed again since (by the user, or by a later run still open) is no longer the run's to undo
    and is left alone. Returns the names given back.

    Example:
        >>> env = {"HOME": "/root", "RANK": "0", "MINE": "2", "THEIRS": "b"}
        >>> before = {"HOME": "/root", "MINE": "1", "THEIRS": "a"}
        >>> started = {"HOME": "/root", "RANK": "0", "MINE": "1", "THEIRS": "c"}
        >>> give_back(env, before, started), env
        (['RANK'], {'HOME': '/root', 'MINE': '2', 'THEIRS': 'b'})
    """
    names = sorted(name for name in set(before) | set(started)
                   if before.get(name) != started.get(name) and env.get(name) == started.get(name))
    for name in names:
        if name in before:
            env[name] = before[name]
        else:
            env.pop(name, None)
    return names
