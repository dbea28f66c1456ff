"""Every error hvdtrain raises on purpose, in one place.

UserError and its kinds are mistakes a user can fix: the CLI prints them as one line and exits 2,
never a traceback. WorkerError carries a failure from a worker back to the caller; Stopped is a
clean stop on a signal.
"""
from __future__ import annotations

import signal


class UserError(Exception):
    """Bad input: the message names the bad value and the fix."""


class ConfigError(UserError):
    """A config key or value is wrong."""


class HostsError(UserError):
    """A hostfile, host string or scheduler allocation cannot be used."""


class LaunchError(UserError):
    """The job could not be started as asked (e.g. an argument cannot be sent to the workers)."""


class WorkerError(RuntimeError):
    """A worker raised. `rank` is the first rank that failed on its own, `remote_traceback` its traceback;
    `user_error` is its one-line message when that was a hvdtrain UserError (bad config, missing plug-in)."""

    def __init__(self, message: str, rank: int | None = None, remote_traceback: str = "",
                 user_error: str | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.remote_traceback = remote_traceback
        self.user_error = user_error


class Stopped(Exception):
    """Training stopped on a signal, at a step every rank agreed on."""

    def __init__(self, signum: int, step: int, checkpoint: str | None) -> None:
        name = signal.Signals(signum).name
        where = f"; checkpoint {checkpoint}" if checkpoint else ""
        super().__init__(f"stopped by {name} at step {step}{where}")
        self.signum = signum


def first_line(err: BaseException, limit: int = 200) -> str:
    """An exception's first non-empty line, for one-line messages; its class name when the message is empty.

    Example:
        >>> first_line(ValueError("bad shape\\n  at layer 3")), first_line(KeyError())
        ('bad shape', 'KeyError')
    """
    for line in str(err).splitlines():
        if line.strip():
            return line.strip()[:limit]
    return type(err).__name__


def is_peer_failure(kind: str, message: str) -> bool:
    """The one rule: a rank that failed only because another rank went away first (its error is the real one).

    Args:
        kind: the exception's class name; message: its text.
    """
    return kind == "HorovodInternalError" or "shut down" in message


def peer_failure_of(err: BaseException) -> bool:
    return is_peer_failure(type(err).__name__, str(err))
