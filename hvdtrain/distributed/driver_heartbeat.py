"""An elastic worker tells the driver once a second that it is alive (UDP), so a frozen or cut-off worker is dropped.

Why: Horovod 0.28.1's elastic driver re-forms the world only when a worker process exits or host discovery
changes. A worker that freezes (SIGSTOP, a swap storm, a debugger) or whose host drops off the network exits
nothing the driver can see, so the survivors wait in their re-rendezvous for as long as it lasts (measured: a
90 s SIGSTOP of one of three workers stopped all three for 90 s). `hvdtrain launch`'s elastic driver
(launcher/worker_watch.py) listens to these heartbeats and drops a worker silent for its own --peer-timeout-s as
if it had failed; Horovod then blacklists its host and goes on with the others. A dropped worker that comes
back (SIGCONT, the link healed) is told so in the answer to its next heartbeat and exits, so it cannot claim
its old slot beside the worker the driver starts there later.

Authenticated (control_wire.py): every beat and the driver's answer are sealed with the job's key, which
reaches the worker in the 0600 secrets file or the pickled job, never on a command line; without a key the
worker does not beat. The socket is connect()ed to the driver, so the kernel delivers only the driver's
datagrams, and only an authenticated answer naming this very worker (host, slot, pid) ends it. A beat says
who beats, nothing else: how long a silence the driver tolerates is the driver's setting, not the packet's.

The same channel carries the driver's "save" as it ends a job below --min-np: a worker waiting for the world
to re-form saves the last commit (train/loop_run.py) and answers "saved", so the driver stops the job only after
it, however late the worker noticed the loss (a timer of the worker's own could lose that race).
"""
from __future__ import annotations

import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from hvdtrain.distributed import control_wire
from hvdtrain.distributed.control_wire import FROM_DRIVER, HEARTBEAT_S, MAX_DATAGRAM, TO_DRIVER
from hvdtrain.environment import process

WATCH_ENV = "HVDTRAIN_WORKER_WATCH"   # the PORT of the driver's watch, set by hvdtrain's elastic driver
# The driver's address as its workers reach it: Horovod's elastic driver gives them its rendezvous server's.
DRIVER_ADDRESS_ENV = "HOROVOD_GLOO_RENDEZVOUS_ADDR"
DRIVER_SENDER = "driver"
BEAT, BYE, DROPPED, SAVE, SAVED = "beat", "bye", "dropped", "save", "saved"
DROPPED_EXIT = 1


def worker_id(host: str, slot: int, pid: int, nonce: str = "") -> str:
    """A worker's sender id on the wire: Horovod's host name and slot, the pid, and a nonce the process draws at
    start. The nonce makes a restarted worker new even with the same pid (a container restarted on the same host
    name often gets it): the driver remembers the ids it dropped, and must not take the new one for the old.

    Example:
        >>> worker_id("node2", 1, 4242, "9f3a"), parse_worker_id("node2/1/4242.9f3a")
        ('node2/1/4242.9f3a', ('node2', 1, 4242))
    """
    return f"{host}/{slot}/{pid}" + (f".{nonce}" if nonce else "")


def dropped_notice(worker: str) -> str:
    """The driver's answer to a dropped worker: it names the worker, so it cannot be replayed to another."""
    return f"{DROPPED} {worker}"


def save_request(worker: str) -> str:
    """The driver's request to save the last commit: it names the worker, as the dropped notice does."""
    return f"{SAVE} {worker}"


def parse_worker_id(sender: str) -> tuple[str, int, int] | None:
    """(host, slot, pid) of a worker id, or None when it is not one."""
    host, _, rest = sender.rpartition("/")
    host, _, slot = host.rpartition("/")
    pid, _, nonce = rest.partition(".")
    ok = host and slot.isdigit() and pid.isdigit() and (not nonce or nonce.isalnum())
    return (host, int(slot), int(pid)) if ok else None


def driver_watch(env: Mapping[str, str]) -> tuple[str, int] | None:
    """(address, port) of the driver's watch, or None when no hvdtrain elastic driver runs this job.

    Example:
        >>> driver_watch({"HVDTRAIN_WORKER_WATCH": "5000", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1"})
        ('10.0.0.1', 5000)
    """
    port = env.get(WATCH_ENV, "")
    address = env.get(DRIVER_ADDRESS_ENV, "")
    return (address, int(port)) if address and port.isdigit() and 0 < int(port) < 65536 else None


class Heartbeat:
    def __init__(self, target: tuple[str, int], key: bytes, host: str, slot: int, timeout_s: float,
                 on_save: Callable[[], bool] | None = None) -> None:
        self.target, self.host, self.slot, self.timeout_s = target, host, slot, timeout_s
        # Saves the last commit if this worker waits for the world; False: not now (the driver asks again).
        self.on_save = on_save
        self.saving = threading.Lock()
        self.id = worker_id(host, slot, os.getpid(), secrets.token_hex(4))
        self.sender = control_wire.Sender(key, TO_DRIVER, self.id)
        self.inbox = control_wire.Inbox(key, FROM_DRIVER, {DRIVER_SENDER}, "driver heartbeat socket")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.connected = False
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="hvdtrain-driver-heartbeat", daemon=True)

    def _send(self, body: str) -> None:
        try:
            if not self.connected:   # only the driver's address:port may answer (the kernel drops the rest)
                self.sock.connect(self.target)
                self.connected = True
            self.sock.send(self.sender.seal(body))
        except (OSError, ValueError):   # ValueError: a host name too long for the wire (255 bytes)
            pass   # no route while the link is down: the driver judges the silence

    def _loop(self) -> None:
        next_beat = time.monotonic()
        while not self.done.is_set():
            if time.monotonic() >= next_beat:
                self._send(BEAT)
                next_beat = time.monotonic() + HEARTBEAT_S
            # Beats keep their pace whatever arrives: a flood of datagrams cannot stall them.
            self.sock.settimeout(max(next_beat - time.monotonic(), 0.01))
            try:
                answer = self.inbox.open(self.sock.recv(MAX_DATAGRAM + 1)) if self.connected else None
            except OSError:   # the timeout; or the driver's port refused while it is not up
                if not self.connected:
                    time.sleep(max(next_beat - time.monotonic(), 0))
                continue
            if answer is None or self.done.is_set():
                continue
            if answer.body == dropped_notice(self.id):
                self._dropped()
            elif answer.body == save_request(self.id) and self.on_save and self.saving.acquire(blocking=False):
                # Beside the beats: a save takes a while, and a silent worker would be dropped meanwhile.
                threading.Thread(target=self._save, name="hvdtrain-save-on-request", daemon=True).start()

    def _save(self) -> None:
        try:
            if self.on_save is not None and self.on_save():
                self._send(SAVED)
        finally:
            self.saving.release()

    def _dropped(self) -> None:
        print(f"hvdtrain: note: the elastic job dropped this worker (host {self.host}, slot {self.slot}) "
              f"after a silence past the driver's --peer-timeout-s (frozen, or its host cut off) and went on "
              "without it; it exits", file=sys.stderr, flush=True)
        # From this thread: the training thread may be blocked in a collective or a re-rendezvous.
        os._exit(DROPPED_EXIT)

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=5)
        self._send(BYE)   # a finished worker's silence is no loss
        self.sock.close()


@contextmanager
def beating(timeout_s: float, env: Mapping[str, str] | None = None,
            on_save: Callable[[], bool] | None = None) -> Iterator[Heartbeat | None]:
    """Beat while inside, under an elastic job of `hvdtrain launch` with the job's key (else nothing); say bye on
    the way out. `timeout_s` (the worker's --peer-timeout-s) only switches beating on: 0 is off. `on_save`
    answers the driver's save request (see the module's docstring)."""
    env = os.environ if env is None else env
    watch = driver_watch(env)
    slot = process.elastic_slot(env)
    key = control_wire.key_from_env(env)
    if watch is None or slot is None or timeout_s <= 0:
        yield None
        return
    if key is None:
        print(f"hvdtrain: warning: this elastic worker has no {control_wire.CONTROL_KEY_ENV} (it comes in the "
              "launcher's secrets file): it does not beat, so the driver cannot drop it if it freezes",
              file=sys.stderr, flush=True)
        yield None
        return
    beat = Heartbeat(watch, key, slot[0], slot[1], timeout_s, on_save)
    beat.thread.start()
    try:
        yield beat
    finally:
        beat.stop()
