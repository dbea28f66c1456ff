"""`python -m hvdtrain.launcher.elastic_driver HOROVODRUN_ARGS...`: horovodrun for an elastic job, with a bound
on the time spent below --min-np. `hvdtrain launch` runs this for elastic jobs (Gloo only, so horovodrun
never exec()s mpirun here).

Why: when fewer than --min-np slots remain, Horovod 0.28.1's elastic driver never gives up. Hosts gone
from the discovery output leave every worker blocked in its re-rendezvous with nothing to wake it
(horovod#3494: seen here as a job idle for good); after a worker dies, the driver blacklists its host
and waits HOROVOD_ELASTIC_TIMEOUT (600 s) for slots while the survivors block. A thread here watches the
driver: below --min-np for --start-timeout seconds (the time a replacement host gets to start), it
prints one line naming the hosts that left, stops the driver (which terminates the workers) and exits 1.
Workers see the same bound (WAIT_ENV): a survivor saves the last commit while waiting (train/loop_run.py), and
before the stop this driver asks them for it and waits for their answers (ASK_SAVE_S at most); with enough
slots (a joining host still loading its data) they wait on, as the world can still form.
A worker that stays up but goes silent (frozen, or its host cut off the network) exits nothing Horovod can
see: the workers' heartbeats (launcher/worker_watch.py) drop it after the --peer-timeout-s of the workers'
command (read here, from this driver's own arguments; never from a packet). The heartbeats are sealed with the
job's key (distributed/control_wire.py), which `hvdtrain launch` put in the 0600 secrets file: without it
(this module run by hand) the workers are not watched.
A job that ended in success ends with exit 0 (EndInSuccess): Horovod 0.28.1 stops the driver once the round's
workers have all reported and one of them succeeded, then terminates those still running (a survivor that had
already entered the next rendezvous, READY, right after a re-admission) and counts their exit (255 over ssh)
as the job's result: "exit 1 after done".
Each middleman stops its worker with launcher/shell_stop.py, not Horovod's own function, whose races can hold a
worker's slot for the whole grace or report a terminated worker's exit as 0 (a success, to the driver).
"""
from __future__ import annotations

import logging
import os
import socketserver
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.distributed import control_wire, horovod_rendezvous, horovod_runner
from hvdtrain.distributed.rendezvous_auth import RefusedRequests
from hvdtrain.launcher.worker_watch import WorkerWatch, interface_address

WAIT_ENV = "HVDTRAIN_ELASTIC_WAIT_S"
# Tells workers this driver bounds the wait by the slots (vs --min-np), so they need no fixed bound of their own.
WATCHED_ENV = "HVDTRAIN_ELASTIC_WATCHED"
POLL_S = 1.0
GRACE_S = 45.0   # after giving up: Horovod terminates its workers (SIGTERM, SIGKILL 5 s later) well within this
# Giving up, how long the survivors get to save the last commit: one still in a collective that has yet to fail
# (--gloo-timeout-seconds) does it only once it waits for the world; the job's epoch checkpoints remain either way.
ASK_SAVE_S = 20.0


class BelowMinNpWatch(threading.Thread):
    """Ends the job when the driver has had fewer than --min-np slots for `wait_s` seconds.

    Reads the driver through the adapter (distributed/horovod_runner.DriverView).
    """

    def __init__(self, driver: horovod_runner.DriverView, wait_s: float, workers: WorkerWatch | None = None) -> None:
        super().__init__(name="hvdtrain-below-min-np", daemon=True)
        self.driver, self.wait_s, self.workers = driver, wait_s, workers
        self.gave_up: str | None = None

    def run(self) -> None:
        below_since: float | None = None
        while not self.driver.finished():
            slots, available = self.driver.available()
            assigned = self.driver.assigned_hosts()   # the last world; empty until the job first starts
            if assigned and slots < self.driver.min_np():
                below_since = below_since or time.monotonic()
                if time.monotonic() - below_since >= self.wait_s:
                    self._give_up(sorted(assigned - set(available)))
                    return
            else:
                below_since = None
            time.sleep(POLL_S)

    def _give_up(self, lost: list[str]) -> None:
        unsaved = self.workers.ask_to_save(ASK_SAVE_S) if self.workers is not None else []   # before the stop
        if unsaved:
            print(f"hvdtrain: note: no last commit from {', '.join(unsaved)} within {ASK_SAVE_S:g} s (still in a "
                  "collective that has yet to time out); the run's other checkpoints stand", file=sys.stderr,
                  flush=True)
        left, _ = self.driver.available()
        self.gave_up = (f"hvdtrain: error: fewer than --min-np {self.driver.min_np()} slots for "
                        f"{self.wait_s:g} s: lost host(s) {', '.join(lost) or '(none named)'}; {left} slot(s) "
                        f"left; the job stops (resume with --resume auto from the run's checkpoints)")
        print(self.gave_up, file=sys.stderr, flush=True)
        # Tearing down, the driver thread that waited for slots logs its stop with a traceback, and Horovod's
        # HTTP servers print one for each worker that hung up mid-request: after the line above, noise.
        logging.disable(logging.CRITICAL)
        socketserver.BaseServer.handle_error = _quiet  # type: ignore[method-assign,assignment]
        self.driver.stop(error_message=self.gave_up)   # also wakes a driver thread waiting for slots
        self.exit_later()

    def exit_later(self) -> None:
        """The bound holds even if Horovod's teardown hangs."""
        time.sleep(GRACE_S)
        print("hvdtrain: error: Horovod did not end its workers in time; exiting anyway", file=sys.stderr, flush=True)
        os._exit(1)


def _quiet(*_args: Any) -> None:
    pass


class EndInSuccess:
    """Wraps the driver's handler of a worker's exit: once the driver has stopped because a worker of the round
    succeeded (the job trained to its end and rank 0 printed "done"), a worker it terminated in that stop is
    not a failure of the job.

    Horovod 0.28.1 (elastic/registration.py `_on_workers_recorded`): when every worker of a round has recorded
    a state and one is SUCCESS, it calls `driver.stop()`, whose shutdown event terminates whatever still runs:
    a survivor that recorded READY for a new rendezvous (a host update that raced the end of the job) or one
    still starting. Its exit code is then added to the results, and `launch_gloo_elastic` raises for it.
    Exits this forgives: non-zero, handled after such a stop, of a worker whose state in the last round is not
    FAILURE (a worker that failed in that round still fails the job, as in Horovod).
    """

    def __init__(self, driver: horovod_runner.DriverView, handle: Callable[..., None]) -> None:
        self.driver, self.handle = driver, handle
        self.forgiven: list[str] = []

    def __call__(self, slot_info: Any, exit_code: int, timestamp: float) -> None:
        if (exit_code != 0 and self.driver.stopped_by_success()
                and not self.driver.failed_in_last_round(slot_info.hostname, slot_info.local_rank)):
            name = f"{slot_info.hostname}[{slot_info.local_rank}]"
            self.forgiven.append(name)
            print(f"hvdtrain: note: the job had finished; the worker {name}, ended by Horovod as it stopped the "
                  f"job (exit {exit_code}), is not counted as a failure", file=sys.stderr, flush=True)
            exit_code = 0
        self.handle(slot_info, exit_code, timestamp)


def peer_timeout_s(command: list[str]) -> float:
    """The workers' --peer-timeout-s as their command line gives it, else TrainConfig's default.

    Example:
        >>> peer_timeout_s(["python", "-m", "hvdtrain", "--peer-timeout-s", "8"]), peer_timeout_s(["train.py"])
        (8.0, 45.0)
    """
    for i, arg in enumerate(command):
        name, eq, value = arg.partition("=")
        if name == "--peer-timeout-s":
            text = value if eq else (command[i + 1] if i + 1 < len(command) else "")
            try:
                return float(text)
            except ValueError:
                break   # the worker refuses it with a clear error of its own
    return float(TrainConfig.peer_timeout_s)


def worker_watch(args: Any, env: dict[str, str] | os._Environ[str]) -> WorkerWatch | None:
    """The watch of the workers' heartbeats, bound where they will reach this driver; None without the job's key."""
    key = control_wire.key_from_env(env)
    if key is None:
        print(f"hvdtrain: warning: no {control_wire.CONTROL_KEY_ENV} (`hvdtrain launch` gives one): frozen workers "
              "are not dropped", file=sys.stderr, flush=True)
        return None
    return WorkerWatch(key.decode(), peer_timeout_s(args.command or []), interface_address(args.nics))


def main(argv: list[str]) -> int:
    args = horovod_runner.horovodrun_args(argv)
    if args.log_level:   # as horovodrun's own entry point does
        logging.addLevelName(logging.NOTSET, "TRACE")
        logging.basicConfig(level=logging.getLevelName(args.log_level))
    wait_s = args.start_timeout or int(os.environ.get("HOROVOD_START_TIMEOUT", "30"))
    os.environ[WAIT_ENV] = str(wait_s)   # horovodrun forwards its environment to the workers
    os.environ[WATCHED_ENV] = "1"
    watches: list[BelowMinNpWatch] = []
    workers = worker_watch(args, os.environ)
    key = control_wire.key_from_env(os.environ)
    os.environ.pop(control_wire.CONTROL_KEY_ENV, None)   # horovodrun would write it on the workers' command lines
    if workers is not None:   # its port reaches the workers with horovodrun's environment (the key: secrets file)
        os.environ.update(workers.env())

    def watch(driver: Any) -> None:
        view = horovod_runner.DriverView(driver)
        view.wrap_worker_exit(lambda handle: EndInSuccess(view, handle))
        watches.append(BelowMinNpWatch(view, wait_s, workers))
        watches[-1].start()
        if workers is not None:
            workers.watch(view)

    refused = RefusedRequests("the elastic rendezvous")
    bind = interface_address(args.nics)
    try:
        with horovod_rendezvous.horovodrun_rendezvous_guarded(key, "" if bind == "0.0.0.0" else bind, refused), \
                horovod_runner.driver_created(watch):
            horovod_runner.horovodrun_run(args)
    except RuntimeError as err:
        if not any(w.gave_up for w in watches):
            print(f"hvdtrain: error: {err}".rstrip(), file=sys.stderr, flush=True)
        return 1
    finally:
        refused.summary()
    # After giving up, Horovod may still return normally (a later stop() clears the error message).
    return 1 if any(w.gave_up for w in watches) else 0


if __name__ == "__mp_main__":   # each middleman Horovod spawns re-imports this module: hvdtrain's stop of its worker
    from hvdtrain.launcher import shell_stop

    shell_stop.install()

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
