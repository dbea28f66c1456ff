"""Start N Horovod workers from Python or a notebook and bring their results (or errors) back.

This module uses Horovod's launcher (horovod.runner), not its torch binding: the calling process
never initialises Horovod or touches a CUDA device; only the workers do.
"""
from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.distributed import control_wire, horovod_rendezvous, horovod_runner
from hvdtrain.distributed.control_wire import CONTROL_KEY_ENV
from hvdtrain.distributed.rendezvous_auth import RefusedRequests
from hvdtrain.environment.credentials import split_env
from hvdtrain.environment.secrets_file import SECRETS_FILE_ENV, write_secrets_file
from hvdtrain.errors import LaunchError, WorkerError
from hvdtrain.launcher.guard import (
    Guarded,
    check_picklable,
    patched_environ,
    rank0_result,
    target,
    worker_pythonpath,
)
from hvdtrain.launcher.horovodrun import remove_quietly
from hvdtrain.launcher.job_store import JobStore, serving
from hvdtrain.launcher.main_guard import check_main_guard
from hvdtrain.launcher.sealed import KEY_VAR, SealedJob, new_key, seal


def launch(fn_or_config: Callable[..., Any] | TrainConfig, *args: Any, np: int = 2, hosts: str | None = None,
           all_ranks: bool = False, use_mpi: bool = False, network_interfaces: list[str] | None = None,
           start_timeout: int = 120, env: dict[str, str] | None = None, secrets_dir: str | None = None,
           **kwargs: Any) -> Any:
    """Run a function (or a config-driven fit) on `np` Horovod workers and return rank 0's result.

    Args:
        fn_or_config: a function to run on every worker (it may call hvdtrain.Trainer/fit), or a
            TrainConfig to train with `hvdtrain.fit`.
        *args: arguments for the function; they must be picklable (cloudpickle).
        **kwargs: keyword arguments for the function, picklable as well.
        np: number of workers.
        hosts: Horovod host string such as "node1:2,node2:2"; default "localhost:<np>".
        all_ranks: return every rank's result as a list instead of rank 0's.
        use_mpi: launch with MPI instead of Gloo.
        network_interfaces: NICs for Horovod's traffic; default ["lo"] on localhost.
        start_timeout: seconds to wait for all workers to start.
        env: extra environment variables for the workers. Credential-like ones (credentials.is_credential),
            here or in this process's environment, reach the workers inside the sealed job, never on
            a command line; the rest go the way horovodrun sends its environment.
        secrets_dir: folder of the launch's 0600 key file, which every worker reads at the same path
            (sealed.py). Default: this host's temp folder when `hosts` is None, else the current folder
            (where Horovod starts the remote workers): pass a folder all hosts share when that is not one.
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
    check_main_guard("hvdtrain.launch")
    fn, args = target(fn_or_config, args, "launch")
    check_picklable(fn, args, kwargs)
    localhost = hosts is None
    if localhost:
        hosts = f"localhost:{np}"
        network_interfaces = network_interfaces or ["lo"]

    # Workers import what this process can: functions pickled by reference need their modules.
    pythonpath = worker_pythonpath((env or {}).get("PYTHONPATH", os.environ.get("PYTHONPATH", "")))
    # horovodrun (Gloo) writes its environment's values onto every worker's command line.
    public, secrets = split_env({**os.environ, **(env or {})})
    # Horovod carries the job and the results through an unauthenticated HTTP store: both go sealed with a
    # key of this launch, which reaches the workers in a 0600 file, never over the network (job_store.py).
    key = new_key()
    # In the same file, the job's control key: Horovod's Gloo rendezvous then takes requests only from the workers
    # (their Horovod reads the file named by SECRETS_FILE_ENV; Horovod patch 0001), and the peer watch needs no key
    # sent between the ranks.
    control_key = control_wire.new_key()
    folder = Path(secrets_dir) if secrets_dir else Path(tempfile.gettempdir() if localhost else os.getcwd())
    key_file = write_secrets_file({KEY_VAR: key.hex(), CONTROL_KEY_ENV: control_key}, folder.resolve())
    job = SealedJob(str(key_file), seal(key, "job", cloudpickle.dumps(Guarded(fn, args, kwargs, secrets))))
    address = _listen_address(network_interfaces)
    store = JobStore(codec_body(job), key, np, host=address, raw_job=job.job)
    refused = RefusedRequests("launch(): the Gloo rendezvous")
    worker_environ = {**public, "PYTHONPATH": pythonpath, SECRETS_FILE_ENV: str(key_file)}
    try:
        with serving(store), patched_environ(worker_environ, drop=set(os.environ) - set(public)), \
                horovod_rendezvous.horovodrun_rendezvous_guarded(control_key.encode(), address, refused):
            results = horovod_runner.run(job, num_proc=np, hosts=hosts, use_gloo=not use_mpi, use_mpi=use_mpi,
                                         network_interfaces=network_interfaces, start_timeout=start_timeout,
                                         disable_cache=True, executable=sealed_task_entry())
    except horovod_runner.AdapterError as err:   # before any worker starts: this Horovod is not the one expected
        raise LaunchError(f"hvdtrain.launch(): {err}") from None
    except RuntimeError as err:  # a worker process died without returning (killed, os._exit, ...)
        raise WorkerError(f"a worker process died: {err}") from None
    finally:
        store.shutdown_server()
        remove_quietly(key_file)
        refused.summary()
    return rank0_result(results, all_ranks)


def sealed_task_entry() -> str | None:
    """The worker entry Horovod starts in place of `python -m horovod.runner.run_task` (launcher/sealed_task.py: it
    opens the job before unpickling it), beside this Python as pip installs console scripts; None without it (an
    install without hvdtrain's scripts): Horovod's run_task then unpickles the SealedJob, as docs/security.md says."""
    entry = Path(sys.executable).parent / "hvdtrain-sealed-task"
    return str(entry) if entry.exists() else None


def codec_body(value: Any) -> bytes:
    """`value` as Horovod's store holds it and its workers read it (horovod.runner.common.util.codec)."""
    import base64
    import pickle

    return base64.b64encode(cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def _listen_address(network_interfaces: list[str] | None) -> str:
    """The IPv4 address of the one interface the job uses, as Horovod picks its driver address; '' (every
    interface) when there are several or Horovod finds them itself."""
    if not network_interfaces or len(network_interfaces) != 1:
        return ""
    try:
        return horovod_runner.driver_ip(network_interfaces)
    except (KeyError, RuntimeError):
        return ""   # Horovod says what is wrong with the interface
