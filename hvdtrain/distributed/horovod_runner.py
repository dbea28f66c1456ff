"""The one adapter to Horovod's launcher side (horovod.runner, horovod.spark): its public calls, and every
internal of its elastic driver and launcher that hvdtrain relies on.

Why one module: Horovod 0.28.1 is the last release and hvdtrain reaches past its public API in a few places
(the elastic driver's host manager, worker registry and exit handler; the launcher's job store). Each such
reach is a function here, so a newer Horovod breaks one file, and `check_version` says at start-up when the
Horovod found is not the one these were written for. Nothing here imports horovod.torch (that is
distributed/runtime.py): the launching process never initialises Horovod.
"""
from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

WRITTEN_FOR = "0.28.1"
_warned = threading.Event()
# The names of horovod.runner.launch that _run_static calls for a function job (Horovod 0.28.1).
_JOB_STORE_NAMES = ("KVStoreServer", "put_data_into_kvstore", "read_data_from_kvstore")
_one_launch = threading.Lock()


class AdapterError(RuntimeError):
    """The installed Horovod does not work the way an internal this module relies on did in 0.28.1."""


def version() -> str:
    import horovod

    return str(getattr(horovod, "__version__", "?"))


def version_note(found: str) -> str | None:
    """The one line for a Horovod other than the one this adapter was written for, else None.

    Example:
        >>> version_note("0.28.1") is None, version_note("0.29.0")[:40]
        (True, 'hvdtrain: note: Horovod 0.29.0 is not th')
    """
    if found == WRITTEN_FOR:
        return None
    return (f"hvdtrain: note: Horovod {found} is not the {WRITTEN_FOR} hvdtrain's launcher adapter was written "
            "for (hvdtrain/distributed/horovod_runner.py); launching and elastic recovery may misbehave")


def check_version(warn: Callable[[str], None] | None = None) -> None:
    """Say once per process (on stderr by default) when the installed Horovod is not the one this adapter was
    written for."""
    note = version_note(version())
    if note and not _warned.is_set():
        _warned.set()
        (warn or (lambda line: print(line, file=sys.stderr, flush=True)))(note)


# ---------------------------------------------------------------- public API


def run(fn: Any, **kwargs: Any) -> Any:
    """horovod.runner.run (the function launcher)."""
    import horovod.runner

    check_version()
    return horovod.runner.run(fn, **kwargs)


def driver_ip(network_interfaces: list[str]) -> str:
    """The address Horovod's launcher gives its workers for the driver, on these interfaces."""
    from horovod.runner.util.network import get_driver_ip

    return str(get_driver_ip(network_interfaces))


def spark_run() -> tuple[Callable[..., Any], type[BaseException]]:
    """(horovod.spark.run, the TimeoutException it raises); ImportError where Horovod's Spark part is unusable."""
    import horovod.spark
    from horovod.runner.common.util.timeout import TimeoutException

    check_version()
    return horovod.spark.run, TimeoutException


@contextmanager
def job_store_replaced(server: Callable[..., Any], put: Callable[..., None],
                       read: Callable[..., Any]) -> Iterator[None]:
    """Inside: horovod.runner.run of a function uses `server()` as its key-value store and `put`/`read` to hand
    the job over and fetch results, instead of Horovod's unauthenticated HTTP store. One launch at a time per
    process (the patch is on Horovod's module). Raises AdapterError, before patching, when Horovod's launcher
    no longer calls these names."""
    import horovod.runner.launch as launch_module

    code = getattr(getattr(launch_module, "_run_static", None), "__code__", None)
    uses = set(code.co_names) if code is not None else set()
    missing = [name for name in _JOB_STORE_NAMES if name not in uses or not hasattr(launch_module, name)]
    if missing:
        raise AdapterError(f"Horovod {version()}'s launcher no longer calls {', '.join(missing)} in "
                           "horovod.runner.launch._run_static")
    with _one_launch:
        saved = {name: getattr(launch_module, name) for name in _JOB_STORE_NAMES}
        launch_module.KVStoreServer = server
        launch_module.put_data_into_kvstore = put
        launch_module.read_data_from_kvstore = read
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(launch_module, name, value)


def sign_result_put(headers: Callable[[str, bytes], dict[str, str]]) -> bool:
    """In a worker Horovod's function launcher started (`python -m horovod.runner.run_task ADDR PORT`, 0.28.1): its
    PUT of the result carries `headers(rank_text, body)`, so the launcher's store can refuse a stranger's PUT before
    reading its body. False (nothing changed) in any other process. run_task runs as __main__ and calls the
    put_data_into_kvstore it imported by name once the function returns: replacing that name there is enough."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", "") != "horovod.runner.run_task":
        return False
    if version() != WRITTEN_FOR or not hasattr(main, "put_data_into_kvstore"):
        raise AdapterError(f"Horovod {version()}'s run_task no longer PUTs its result with put_data_into_kvstore: "
                           "check hvdtrain/distributed/horovod_runner.py sign_result_put")
    from urllib.request import Request, urlopen

    from horovod.runner.common.util import codec

    def put_data_into_kvstore(addr: str, port: int, scope: str, key: str, value: Any) -> None:
        body = codec.dumps_base64(value, to_ascii=False)
        request = Request(f"http://{addr}:{port}/{scope}/{key}", data=body, method="PUT", headers=headers(key, body))
        try:
            urlopen(request).close()
        except OSError as err:   # HTTPError and URLError are OSErrors: as Horovod's own put raises
            raise RuntimeError("Put data input KVStore server failed.", err) from None

    main.put_data_into_kvstore = put_data_into_kvstore   # type: ignore[union-attr]
    return True


def set_termination_grace(seconds: int) -> int:
    """Seconds Horovod's launcher gives a worker between SIGTERM and SIGKILL (its private
    safe_shell_exec.GRACEFUL_TERMINATION_TIME_S, 5 s in 0.28.1); the value now in force."""
    from horovod.runner.common.util import safe_shell_exec

    if version() != WRITTEN_FOR or not hasattr(safe_shell_exec, "GRACEFUL_TERMINATION_TIME_S"):
        raise AdapterError(f"Horovod {version()} is installed; the grace is Horovod {WRITTEN_FOR}'s "
                           "safe_shell_exec.GRACEFUL_TERMINATION_TIME_S: check that it still has it, then update "
                           "hvdtrain/distributed/horovod_runner.py")
    safe_shell_exec.GRACEFUL_TERMINATION_TIME_S = seconds
    return seconds


def replace_shell_termination(stop: Callable[[int, float], None]) -> None:
    """Make Horovod's launcher stop a worker's shell with `stop(shell_pid, grace_s)` instead of its private
    safe_shell_exec.terminate_executor_shell_and_children (launcher/shell_stop.py says why). The middleman looks
    that name up when the job stops, so setting it in the middleman's process before then is enough."""
    from horovod.runner.common.util import safe_shell_exec

    if version() != WRITTEN_FOR or not hasattr(safe_shell_exec, "terminate_executor_shell_and_children"):
        raise AdapterError(f"Horovod {version()} is installed; hvdtrain replaces Horovod {WRITTEN_FOR}'s "
                           "safe_shell_exec.terminate_executor_shell_and_children: check that its races remain, "
                           "then update hvdtrain/distributed/horovod_runner.py")

    def terminate_executor_shell_and_children(pid: int) -> None:
        stop(pid, safe_shell_exec.GRACEFUL_TERMINATION_TIME_S)   # read at stop time: the grace set meanwhile

    safe_shell_exec.terminate_executor_shell_and_children = terminate_executor_shell_and_children


def run_commandline() -> int:
    """horovodrun itself, in this process."""
    from horovod.runner.launch import run_commandline as horovodrun

    return int(horovodrun() or 0)


# ---------------------------------------------------------------- the elastic driver (hvdtrain launch)


class DriverView:
    """What hvdtrain reads and does on a running Horovod ElasticDriver: public methods where 0.28.1 has them
    (finished, stop, has_rank_assignment, host_assignments), its private state where it has none."""

    def __init__(self, driver: Any) -> None:
        from horovod.runner.elastic.registration import FAILURE, SUCCESS

        self.driver, self.failure, self.success = driver, FAILURE, SUCCESS

    def finished(self) -> bool:
        return bool(self.driver.finished())

    def stop(self, error_message: str | None = None) -> None:
        self.driver.stop(error_message=error_message)
        with self.driver._wait_hosts_cond:   # wake a driver thread waiting for slots: it sees the stop
            self.driver._wait_hosts_cond.notify_all()

    def has_rank_assignment(self, host: str, slot: int) -> bool:
        """The slot has a place in the current world (False for a blacklisted host)."""
        return bool(self.driver.has_rank_assignment(host, slot))

    def assigned_hosts(self) -> set[str]:
        """Hosts of the last world (empty until the job first starts)."""
        return set(self.driver.host_assignments)

    def min_np(self) -> int:
        return int(self.driver._min_num_proc)

    def available(self) -> tuple[int, list[str]]:
        """(slots available now, hosts available now) by the driver's own discovery and blacklist."""
        hosts = self.driver._host_manager.current_hosts
        return hosts.count_available_slots(), list(hosts.available_hosts)

    def record_failure(self, host: str, slot: int) -> None:
        """Record a worker as failed, as Horovod does when it exits non-zero (it waits for the others' reports).
        Raises AdapterError when the driver is still running but would not take it."""
        try:
            self.driver._worker_registry.record_failure(host, slot)
        except Exception as err:
            if self.driver.finished():
                return   # the driver stopped meanwhile (its barrier broken): nothing left to drop from
            raise AdapterError(f"Horovod {version()}'s elastic driver did not record the failure of "
                               f"{host}[{slot}]: {type(err).__name__}: {err}") from err

    def stopped_by_success(self) -> bool:
        """The driver stopped because a worker of the round succeeded, with no error of its own."""
        return (self.driver.finished() and self.driver._results._error_message is None
                and self.driver._worker_registry.count(self.success) > 0)

    def failed_in_last_round(self, host: str, local_rank: int) -> bool:
        return self.driver._worker_registry._states.get((host, local_rank)) == self.failure

    def wrap_worker_exit(self, wrap: Callable[[Callable[..., None]], Callable[..., None]]) -> None:
        """Replace the driver's handler of a worker's exit (slot_info, exit_code, timestamp) by wrap(original)."""
        self.driver._handle_worker_exit = wrap(self.driver._handle_worker_exit)


@contextmanager
def driver_created(callback: Callable[[Any], None]) -> Iterator[None]:
    """Inside: every ElasticDriver Horovod builds (deep inside launch_gloo_elastic, so its constructor is the one
    place to hook) is handed to `callback` right after it is constructed."""
    from horovod.runner.elastic import driver as hvd_driver

    original_init = hvd_driver.ElasticDriver.__init__

    def init_and_call(driver: Any, *a: Any, **kw: Any) -> None:
        original_init(driver, *a, **kw)
        callback(driver)

    hvd_driver.ElasticDriver.__init__ = init_and_call
    try:
        yield
    finally:
        hvd_driver.ElasticDriver.__init__ = original_init


def horovodrun_args(argv: list[str]) -> Any:
    """horovodrun's own parsing of `argv` (its args namespace)."""
    from horovod.runner import launch as hvd_launch

    saved, sys.argv = sys.argv, ["horovodrun", *argv]
    try:
        return hvd_launch.parse_args()
    finally:
        sys.argv = saved


def horovodrun_run(args: Any) -> None:
    """horovodrun's run of parsed args, in this process (its private _run: the public entry re-parses argv)."""
    from horovod.runner import launch as hvd_launch

    check_version()
    hvd_launch._run(args)
