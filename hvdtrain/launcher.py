"""Start N Horovod workers from Python or a notebook and bring their results (or errors) back.

This module uses Horovod's launcher (horovod.runner), not its torch binding: the calling process
never initialises Horovod or touches a CUDA device; only the workers do.
"""
from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle

from hvdtrain.config import TrainConfig
from hvdtrain.errors import UserError


class LaunchError(UserError):
    """The job could not be started as asked (e.g. an argument cannot be sent to the workers)."""


class WorkerError(RuntimeError):
    """A worker raised. `rank` is the first rank that failed on its own, `remote_traceback` its traceback."""

    def __init__(self, message: str, rank: int | None = None, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.remote_traceback = remote_traceback


@dataclass
class _Failure:
    rank: int
    kind: str
    message: str
    traceback: str

    @property
    def consequential(self) -> bool:
        """Failed only because another rank went away first."""
        return "shut down" in self.message or "HorovodInternalError" in self.kind


class _Guarded:
    """Runs the user function on a worker; an exception comes back as a value with rank and traceback."""

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __call__(self) -> Any:
        try:
            return self.fn(*self.args, **self.kwargs)
        except BaseException as err:  # noqa: B036 - everything must reach the caller, even SystemExit
            failure = _Failure(int(os.environ.get("HOROVOD_RANK", -1)), type(err).__name__, str(err),
                               traceback.format_exc())
            # Peers blocked in a collective with this rank fail now instead of waiting for a timeout.
            from hvdtrain import dist

            dist.shutdown()
            return failure


def _fit_config(config: TrainConfig) -> Any:
    from hvdtrain.trainer import fit

    return fit(config)


def _check_picklable(fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    for label, value in [("the function", fn)] + [(f"argument {i}", a) for i, a in enumerate(args)] + [
            (f"argument {k!r}", v) for k, v in kwargs.items()]:
        try:
            cloudpickle.dumps(value)
        except Exception as err:
            raise LaunchError(f"{label} ({type(value).__name__}) cannot be sent to the workers: {err}; "
                              "pass plain data or build the object inside the function") from None


def _worker_pythonpath(current: str) -> str:
    prefixes = (sys.prefix, sys.base_prefix)
    extra = [p for p in sys.path if p and os.path.isdir(p) and not p.startswith(prefixes)]
    parts = [p for p in current.split(os.pathsep) if p] + extra
    return os.pathsep.join(dict.fromkeys(parts))


def launch(fn_or_config: Callable[..., Any] | TrainConfig, *args: Any, np: int = 2, hosts: str | None = None,
           all_ranks: bool = False, use_mpi: bool = False, network_interfaces: list[str] | None = None,
           start_timeout: int = 120, env: dict[str, str] | None = None, **kwargs: Any) -> Any:
    """Run a function (or a config-driven fit) on `np` Horovod workers and return rank 0's result.

    Args:
        fn_or_config: a function to run on every worker (it may call hvdtrain.Trainer/fit), or a
            TrainConfig to train with `hvdtrain.fit`.
        *args, **kwargs: arguments for the function; they must be picklable (cloudpickle).
        np: number of workers.
        hosts: Horovod host string such as "node1:2,node2:2"; default "localhost:<np>".
        all_ranks: return every rank's result as a list instead of rank 0's.
        use_mpi: launch with MPI instead of Gloo.
        network_interfaces: NICs for Horovod's traffic; default ["lo"] on localhost.
        start_timeout: seconds to wait for all workers to start.
        env: extra environment variables for the workers.
    Returns:
        Rank 0's return value (for a TrainConfig: its History), or the list of all ranks' values.
    Raises:
        WorkerError: a worker raised; the message names the rank and carries its traceback.
        LaunchError: an argument cannot be sent to the workers (raised before any worker starts).
    Example:
        >>> def train(epochs):
        ...     import hvdtrain
        ...     return hvdtrain.fit(hvdtrain.load_config(epochs=epochs, run_dir=""))[-1]["val_acc"]
        >>> hvdtrain.launch(train, 3, np=2)
    """
    if np < 1:
        raise LaunchError(f"np must be >= 1, got {np}")
    if isinstance(fn_or_config, TrainConfig):
        fn, args = _fit_config, (fn_or_config, *args)
    elif callable(fn_or_config):
        fn = fn_or_config
    else:
        raise LaunchError(f"launch needs a function or a TrainConfig, got {type(fn_or_config).__name__}")
    _check_picklable(fn, args, kwargs)
    if hosts is None:
        hosts = f"localhost:{np}"
        network_interfaces = network_interfaces or ["lo"]

    import horovod.runner

    saved = dict(os.environ)
    os.environ.update(env or {})
    # Workers import what this process can: functions pickled by reference need their modules.
    os.environ["PYTHONPATH"] = _worker_pythonpath(os.environ.get("PYTHONPATH", ""))
    try:
        results = horovod.runner.run(_Guarded(fn, args, kwargs), num_proc=np, hosts=hosts,
                                     use_gloo=not use_mpi, use_mpi=use_mpi,
                                     network_interfaces=network_interfaces, start_timeout=start_timeout,
                                     disable_cache=True)
    except RuntimeError as err:  # a worker process died without returning (killed, os._exit, ...)
        raise WorkerError(f"a worker process died: {err}") from None
    finally:
        os.environ.clear()
        os.environ.update(saved)
    failures = [r for r in results if isinstance(r, _Failure)]
    if failures:
        first = next((f for f in failures if not f.consequential), failures[0])
        others = sorted(f.rank for f in failures if f is not first)
        also = f" (rank(s) {others} failed as a consequence)" if others else ""
        raise WorkerError(f"rank {first.rank} raised {first.kind}: {first.message}{also}\n"
                          f"--- traceback on rank {first.rank} ---\n{first.traceback}",
                          rank=first.rank, remote_traceback=first.traceback)
    return results if all_ranks else results[0]
