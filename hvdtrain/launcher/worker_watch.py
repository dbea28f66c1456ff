"""The elastic driver's side of the workers' heartbeats (distributed/driver_heartbeat.py): a worker silent for
the driver's --peer-timeout-s is dropped as if it had failed, so a frozen worker or a host cut off the network
costs the job that long, not the length of the fault.

Dropping = recording a failure for the worker's slot in Horovod's worker registry, which is what Horovod does
itself when a worker process exits non-zero: once the survivors have reported for the new rendezvous, it
blacklists the host (whose worker process it then terminates), and re-forms the world from the others; after
--blacklist-cooldown-range the host may come back. Reads the driver's private state (host assignments, host
manager, worker registry): Horovod is pinned to 0.28.1.

Authenticated (distributed/control_wire.py): only beats sealed with the job's key, each newer than the last from
its worker, count; anything else is dropped and counted (`inbox.rejected`), so no datagram from outside the
job can drop a healthy worker or keep a frozen one alive. The key goes to the workers in `secrets()` (the 0600
secrets file or the pickled job), only the port in `env()` (which horovodrun puts on command lines).
"""
from __future__ import annotations

import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import psutil

from hvdtrain.distributed import control_wire, horovod_runner
from hvdtrain.distributed.control_wire import CONTROL_KEY_ENV, FROM_DRIVER, HEARTBEAT_S, MAX_DATAGRAM, TO_DRIVER
from hvdtrain.distributed.driver_heartbeat import (
    BYE,
    DRIVER_SENDER,
    SAVED,
    WATCH_ENV,
    dropped_notice,
    parse_worker_id,
    save_request,
)

POLL_S = 1.0


@dataclass
class Heard:
    at: float
    pid: int
    address: Any = None   # where its beats came from: where a save request goes
    id: str = ""          # its worker id on the wire (driver_heartbeat.worker_id)


def interface_address(nics: set[str] | list[str] | None) -> str:
    """Where the workers will reach the driver: with one --network-interfaces NIC, its IPv4 address as Horovod
    picks it for HOROVOD_GLOO_RENDEZVOUS_ADDR (network.get_driver_ip: the last one); else every address."""
    if not nics or len(nics) != 1:
        return "0.0.0.0"
    found = [addr.address for addr in psutil.net_if_addrs().get(next(iter(nics)), []) if addr.family == socket.AF_INET]
    return str(found[-1]) if found else "0.0.0.0"


class WorkerWatch(threading.Thread):
    """Bound before horovodrun starts (its port goes to the workers in `env()`, its key in `secrets()`); watches
    once `watch()` gives it the driver.

    Args:
        key: the job's key (control_wire.new_key()).
        timeout_s: the driver's own --peer-timeout-s: a worker silent this long is dropped; 0 = never.
        address: where to listen: the job's interface's address, where known.
    """

    def __init__(self, key: str, timeout_s: float, address: str = "0.0.0.0") -> None:
        super().__init__(name="hvdtrain-worker-watch", daemon=True)
        self.key, self.timeout_s = key, timeout_s
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((address, 0))
        self.sock.settimeout(POLL_S)
        self.inbox = control_wire.Inbox(key.encode(), TO_DRIVER, label="elastic driver's worker watch")
        self.answer = control_wire.Sender(key.encode(), FROM_DRIVER, DRIVER_SENDER)
        self.driver: Any = None
        self.heard: dict[tuple[str, int], Heard] = {}
        self.dropped: set[str] = set()   # worker ids (host/slot/pid.nonce): a restarted worker has a new one
        self.saved: set[str] = set()     # answered a save request
        self.lines: list[str] = []

    def env(self) -> dict[str, str]:
        """What may travel on the workers' command lines: the port, no secret."""
        return {WATCH_ENV: str(self.sock.getsockname()[1])}

    def secrets(self) -> dict[str, str]:
        """What must not: the key, for the secrets file or the pickled job."""
        return {CONTROL_KEY_ENV: self.key}

    def watch(self, driver: Any) -> None:
        """Start judging the workers of `driver` (Horovod's ElasticDriver, or the adapter's view of one)."""
        self.driver = driver if isinstance(driver, horovod_runner.DriverView) else horovod_runner.DriverView(driver)
        self.start()

    def run(self) -> None:
        judged = time.monotonic()
        try:
            while not self.driver.finished():
                try:
                    data, sender = self.sock.recvfrom(MAX_DATAGRAM + 1)
                except OSError:
                    data, sender = b"", None
                if data:
                    self.hear(data, sender)
                if time.monotonic() - judged >= POLL_S / 4:   # not once per datagram: a flood costs little
                    judged = time.monotonic()
                    self.judge(judged)
        finally:
            self.sock.close()

    def hear(self, data: bytes, sender: Any) -> None:
        beat = self.inbox.open(data)
        worker = parse_worker_id(beat.sender) if beat is not None else None
        if beat is None or worker is None:
            return
        host, slot, pid = worker
        key = (host, slot)
        if beat.sender in self.dropped:
            if beat.body != BYE:
                try:   # it came back after the job went on without it; sealed, and naming it alone
                    self.sock.sendto(self.answer.seal(dropped_notice(beat.sender)), sender)
                except (OSError, ValueError):
                    pass
        elif beat.body == BYE:
            self.heard.pop(key, None)
        else:
            self.heard[key] = Heard(time.monotonic(), pid, sender, beat.sender)
            if beat.body == SAVED:
                self.saved.add(beat.sender)

    def ask_to_save(self, wait_s: float) -> list[str]:
        """Before the job ends below --min-np: every worker beating now is asked, once a second, to save the last
        commit (one waiting for the world does, then answers) until all have answered or `wait_s` has passed.
        Returns those that did not answer (still in a collective that has yet to fail, or gone)."""
        deadline, asked = time.monotonic() + wait_s, float("-inf")
        while True:
            now = time.monotonic()
            pending = {key: heard for key, heard in list(self.heard.items())
                       if heard.id not in self.saved and now - heard.at < 3 * HEARTBEAT_S}
            if not pending or now >= deadline:
                return [f"{host}[{slot}]" for host, slot in pending]
            if now - asked >= POLL_S:   # again each second, until it answers
                asked = now
                for heard in pending.values():
                    try:
                        self.sock.sendto(self.answer.seal(save_request(heard.id)),
                                         heard.address)
                    except (OSError, TypeError, ValueError):   # TypeError: no address
                        pass
            time.sleep(0.05)

    def judge(self, now: float) -> None:
        if self.timeout_s <= 0:
            return
        for key, heard in list(self.heard.items()):
            host, slot = key
            if not self.driver.has_rank_assignment(host, slot):
                del self.heard[key]   # Horovod has dropped it already, or it has no place in this world
            elif now - heard.at >= self.timeout_s:
                del self.heard[key]
                self.drop(host, slot, heard, now - heard.at)

    def drop(self, host: str, slot: int, heard: Heard, silent_s: float) -> None:
        self.dropped.add(heard.id)
        line = (f"hvdtrain: warning: the worker on host {host} (slot {slot}, pid {heard.pid}) has not been heard from "
                f"for {silent_s:.0f} s (frozen, or its host cut off; --peer-timeout-s {self.timeout_s:g}): the "
                "elastic job drops it and goes on with the others")
        self.lines.append(line)
        print(line, file=sys.stderr, flush=True)
        # record_failure waits until the other workers have reported for the next rendezvous: not here.
        threading.Thread(target=self._record_failure, args=(host, slot), name="hvdtrain-drop-worker",
                         daemon=True).start()

    def _record_failure(self, host: str, slot: int) -> None:
        try:
            self.driver.record_failure(host, slot)
        except horovod_runner.AdapterError as err:   # the driver runs on but did not drop it: say so, loudly
            line = f"hvdtrain: error: could not drop the worker on host {host} (slot {slot}): {err}"
            self.lines.append(line)
            print(line, file=sys.stderr, flush=True)
