"""What every launcher shares: the guard around the user's function on each worker, and how the
workers' results (or errors, named by rank) come back. Used by launcher.py (horovodrun) and spark.py.

Nothing here imports Horovod at module level: it runs in the calling process too.
"""
from __future__ import annotations

import os
import socket
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import cloudpickle

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.environment import process
from hvdtrain.errors import LaunchError, UserError, WorkerError, is_peer_failure


@dataclass
class Failure:
    rank: int
    kind: str
    message: str
    traceback: str
    host: str = ""
    user_error: bool = False

    @property
    def consequential(self) -> bool:
        """Failed only because another rank went away first."""
        return is_peer_failure(self.kind, self.message)


class Guarded:
    """Runs the user function on a worker; an exception comes back as a value with rank and traceback.

    `secrets` (credential variables) travel inside this pickled object, through Horovod's own service
    connection, because horovodrun would put environment values on the workers' command lines.
    """

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict,
                 secrets: dict[str, str] | None = None) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.secrets = secrets or {}

    def __call__(self) -> Any:
        os.environ.update(self.secrets)
        try:
            return self.fn(*self.args, **self.kwargs)
        except BaseException as err:  # noqa: B036 - everything must reach the caller, even SystemExit
            failure = Failure(process.current().rank, type(err).__name__, str(err),
                              traceback.format_exc(), socket.gethostname(), isinstance(err, UserError))
            # Peers blocked in a collective with this rank fail now instead of waiting for a timeout.
            from hvdtrain.distributed import runtime

            runtime.shutdown()
            return failure


def fit_config(config: TrainConfig) -> Any:
    from hvdtrain.train.config_fit import fit

    return fit(config)


def target(fn_or_config: Callable[..., Any] | TrainConfig, args: tuple, caller: str) -> tuple[
        Callable[..., Any], tuple]:
    """The function each worker runs and its arguments: a TrainConfig means `hvdtrain.fit(config)`."""
    if isinstance(fn_or_config, TrainConfig):
        return fit_config, (fn_or_config, *args)
    if callable(fn_or_config):
        return fn_or_config, args
    raise LaunchError(f"{caller} needs a function or a TrainConfig, got {type(fn_or_config).__name__}")


def check_picklable(fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    for label, value in [("the function", fn)] + [(f"argument {i}", a) for i, a in enumerate(args)] + [
            (f"argument {k!r}", v) for k, v in kwargs.items()]:
        try:
            cloudpickle.dumps(value)
        except Exception as err:
            raise LaunchError(f"{label} ({type(value).__name__}) cannot be sent to the workers: {err}; "
                              "pass plain data or build the object inside the function") from None


def worker_pythonpath(current: str) -> str:
    """PYTHONPATH for workers: `current` plus what this process imports from outside the environment
    (a source checkout, the tests folder): functions pickled by reference need their modules."""
    prefixes = (sys.prefix, sys.base_prefix)
    extra = [p for p in sys.path if p and os.path.isdir(p) and not p.startswith(prefixes)]
    parts = [p for p in current.split(os.pathsep) if p] + extra
    return os.pathsep.join(dict.fromkeys(parts))


def rank0_result(results: list[Any], all_ranks: bool) -> Any:
    """Rank 0's value (or all of them), or a WorkerError naming the first rank that failed on its own."""
    failures = [r for r in results if isinstance(r, Failure)]
    if failures:
        first = next((f for f in failures if not f.consequential), failures[0])
        others = sorted(f.rank for f in failures if f is not first)
        also = f" (rank(s) {others} failed as a consequence)" if others else ""
        where = f" on host {first.host}" if first.host else ""
        raise WorkerError(f"rank {first.rank} raised {first.kind}: {first.message}{also}\n"
                          f"--- traceback on rank {first.rank}{where} ---\n{first.traceback}",
                          rank=first.rank, remote_traceback=first.traceback,
                          user_error=f"rank {first.rank}: {first.message}" if first.user_error else None)
    return results if all_ranks else results[0]


@contextmanager
def patched_environ(values: dict[str, str] | None = None, defaults: dict[str, str] | None = None,
                    drop: Iterable[str] = ()) -> Iterator[None]:
    """Inside: os.environ with `values` set, `defaults` set where absent, `drop` removed. After: exactly as before.

    Launchers read the environment when they start workers; the caller's process keeps its own.
    """
    saved = dict(os.environ)
    for key in drop:
        os.environ.pop(key, None)
    os.environ.update(values or {})
    for key, value in (defaults or {}).items():
        os.environ.setdefault(key, value)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
