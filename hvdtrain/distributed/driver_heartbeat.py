"""An elastic worker tells the driver once a second that it is alive (UDP), so a frozen or cut-off worker is dropped.

Why: Horovod 0.28.1's elastic driver re-forms the world only when a worker process exits or host discovery
changes. A worker that freezes (SIGSTOP, a swap storm, a debugger) or whose host drops off the network exits
nothing the driver can see, so the survivors wait in their re-rendezvous for as long as it lasts (measured: a
90 s SIGSTOP of one of three workers stopped all three for 90 s). `hvdtrain launch`'s elastic driver
(launcher/worker_watch.py) listens to these heartbeats and drops a worker silent for its --peer-timeout-s as
if it had failed; Horovod then blacklists its host and goes on with the others. A dropped worker that comes
back (SIGCONT, the link healed) is told so in the answer to its next heartbeat and exits, so it cannot claim
its old slot beside the worker the driver starts there later.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from hvdtrain.environment import process

WATCH_ENV = "HVDTRAIN_WORKER_WATCH"   # "PORT:TOKEN" of the driver's watch, set by hvdtrain's elastic driver
# The driver's address as its workers reach it: Horovod's elastic driver gives them its rendezvous server's.
DRIVER_ADDRESS_ENV = "HOROVOD_GLOO_RENDEZVOUS_ADDR"
HEARTBEAT_S = 1.0
DROPPED = b"dropped"
DROPPED_EXIT = 1


def heartbeat(host: str, slot: int, pid: int, timeout_s: float, token: str, bye: bool = False) -> bytes:
    """One datagram: who beats (Horovod's host name and slot, the pid) and after how long a silence to drop it."""
    return json.dumps({"token": token, "host": host, "slot": slot, "pid": pid, "timeout_s": timeout_s,
                       "bye": bye}).encode()


def driver_watch(env: Mapping[str, str]) -> tuple[tuple[str, int], str] | None:
    """((address, port), token) of the driver's watch, or None when no hvdtrain elastic driver runs this job.

    Example:
        >>> driver_watch({"HVDTRAIN_WORKER_WATCH": "5000:ab12", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1"})
        (('10.0.0.1', 5000), 'ab12')
    """
    port, _, token = env.get(WATCH_ENV, "").partition(":")
    address = env.get(DRIVER_ADDRESS_ENV, "")
    return ((address, int(port)), token) if address and port.isdigit() and token else None


class Heartbeat:
    def __init__(self, target: tuple[str, int], token: str, host: str, slot: int, timeout_s: float) -> None:
        self.target, self.token, self.host, self.slot, self.timeout_s = target, token, host, slot, timeout_s
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.settimeout(HEARTBEAT_S)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="hvdtrain-driver-heartbeat", daemon=True)

    def _send(self, bye: bool = False) -> None:
        try:
            self.sock.sendto(heartbeat(self.host, self.slot, os.getpid(), self.timeout_s, self.token, bye),
                             self.target)
        except OSError:
            pass   # no route while the link is down: the driver judges the silence

    def _loop(self) -> None:
        while not self.done.is_set():
            self._send()
            try:
                answer = self.sock.recv(64)   # waits up to HEARTBEAT_S: the pace of the beats
            except OSError:
                continue
            if answer == DROPPED and not self.done.is_set():
                print(f"hvdtrain: note: the elastic job dropped this worker (host {self.host}, slot {self.slot}) "
                      f"after {self.timeout_s:g} s without a heartbeat (frozen, or its host cut off) and went on "
                      "without it; it exits", file=sys.stderr, flush=True)
                # From this thread: the training thread may be blocked in a collective or a re-rendezvous.
                os._exit(DROPPED_EXIT)

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=5)
        self._send(bye=True)   # a finished worker's silence is no loss
        self.sock.close()


@contextmanager
def beating(timeout_s: float, env: Mapping[str, str] | None = None) -> Iterator[Heartbeat | None]:
    """Beat while inside, under an elastic job of `hvdtrain launch` (else nothing); say bye on the way out."""
    env = os.environ if env is None else env
    watch = driver_watch(env)
    slot = process.elastic_slot(env)
    if watch is None or slot is None or timeout_s <= 0:
        yield None
        return
    beat = Heartbeat(watch[0], watch[1], slot[0], slot[1], timeout_s)
    beat.thread.start()
    try:
        yield beat
    finally:
        beat.stop()
