"""The elastic driver's side of the workers' heartbeats (distributed/driver_heartbeat.py): a worker silent for
its --peer-timeout-s is dropped as if it had failed, so a frozen worker or a host cut off the network costs
the job that long, not the length of the fault.

Dropping = recording a failure for the worker's slot in Horovod's worker registry, which is what Horovod does
itself when a worker process exits non-zero: once the survivors have reported for the new rendezvous, it
blacklists the host (whose worker process it then terminates), and re-forms the world from the others; after
--blacklist-cooldown-range the host may come back. Reads the driver's private state (host assignments, host
manager, worker registry): Horovod is pinned to 0.28.1.
"""
from __future__ import annotations

import json
import secrets
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from hvdtrain.distributed.driver_heartbeat import DROPPED, WATCH_ENV

POLL_S = 1.0


@dataclass
class Heard:
    at: float
    pid: int
    timeout_s: float


class WorkerWatch(threading.Thread):
    """Bound before horovodrun starts (its port and token go to the workers in `env()`); watches once `watch()`
    gives it the driver."""

    def __init__(self) -> None:
        super().__init__(name="hvdtrain-worker-watch", daemon=True)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.settimeout(POLL_S)
        self.token = secrets.token_hex(8)
        self.driver: Any = None
        self.heard: dict[tuple[str, int], Heard] = {}
        self.dropped: set[tuple[str, int, int]] = set()   # (host, slot, pid)
        self.lines: list[str] = []

    def env(self) -> dict[str, str]:
        return {WATCH_ENV: f"{self.sock.getsockname()[1]}:{self.token}"}

    def watch(self, driver: Any) -> None:
        self.driver = driver
        self.start()

    def run(self) -> None:
        try:
            while not self.driver.finished():
                try:
                    data, sender = self.sock.recvfrom(1024)
                except OSError:
                    data, sender = b"", None
                if data:
                    self.hear(data, sender)
                self.judge(time.monotonic())
        finally:
            self.sock.close()

    def hear(self, data: bytes, sender: Any) -> None:
        try:
            beat = json.loads(data)
            key, pid, token = (str(beat["host"]), int(beat["slot"])), int(beat["pid"]), beat["token"]
            timeout_s = float(beat["timeout_s"])
        except (ValueError, KeyError, TypeError):
            return
        if token != self.token:
            return
        if (*key, pid) in self.dropped:
            try:
                self.sock.sendto(DROPPED, sender)   # it came back after the job went on without it
            except OSError:
                pass
        elif beat.get("bye"):
            self.heard.pop(key, None)
        else:
            self.heard[key] = Heard(time.monotonic(), pid, timeout_s)

    def judge(self, now: float) -> None:
        for key, heard in list(self.heard.items()):
            host, slot = key
            if self.driver._host_manager.is_blacklisted(host) or not self._assigned(host, slot):
                del self.heard[key]   # Horovod has dropped it already, or it has no place in this world
            elif now - heard.at >= heard.timeout_s:
                del self.heard[key]
                self.drop(host, slot, heard, now - heard.at)

    def _assigned(self, host: str, slot: int) -> bool:
        assignments = self.driver._host_assignments
        return host in assignments and len(assignments[host]) > slot

    def drop(self, host: str, slot: int, heard: Heard, silent_s: float) -> None:
        self.dropped.add((host, slot, heard.pid))
        line = (f"hvdtrain: warning: the worker on host {host} (slot {slot}, pid {heard.pid}) has not been heard from "
                f"for {silent_s:.0f} s (frozen, or its host cut off; --peer-timeout-s {heard.timeout_s:g}): the "
                "elastic job drops it and goes on with the others")
        self.lines.append(line)
        print(line, file=sys.stderr, flush=True)
        # record_failure waits until the other workers have reported for the next rendezvous: not here.
        threading.Thread(target=self._record_failure, args=(host, slot), name="hvdtrain-drop-worker",
                         daemon=True).start()

    def _record_failure(self, host: str, slot: int) -> None:
        try:
            self.driver._worker_registry.record_failure(host, slot)
        except Exception:   # the driver stopped meanwhile (its barrier broken): nothing left to drop from
            pass
