"""Every rank hears from every other rank once a second, over UDP beside Horovod's own connections.

Why: when a host drops off the network or a worker freezes (SIGSTOP, a debugger, swap), nothing in
the transport says who. Under MPI a collective then waits for ever; under Gloo it fails after
HOROVOD_GLOO_TIMEOUT_SECONDS with "Timed out waiting ...ms for recv operation", naming no one; Horovod's
stall check cannot run either, since its coordinator waits in the same collectives. A peer silent for
`timeout_s` ends this rank with one line that names the peer's rank and host; one silent for a third of
that gets a warning. A shorter blip passes: TCP retransmits what was in flight once the link is back
(measured in docs/troubleshooting.md: 20 s partitions ridden out under Gloo and MPI).

Only the lowest rank that still hears from the others prints, so a job writes one line, not one per
rank; the others exit quietly with the same status. Elastic jobs do not use this: their
workers beat to the driver instead (driver_heartbeat.py), which drops a silent one and goes on.

Authenticated (control_wire.py): every heartbeat is sealed with the job's key (HVDTRAIN_CONTROL_KEY where
a launcher delivered one to every rank, else a random key rank 0 sends the others over Horovod itself at start-up
(in clear, as Horovod's own traffic is: plain horovodrun; `hvdtrain launch` always delivers one), never
over UDP), from a sender id each rank draws afresh per watch, with a sequence number that only grows.
Forged, replayed, malformed, or another job's datagrams are counted and dropped: they cannot end a rank
(no exception reaches the watch's thread), mark a healthy rank silent (draining them never delays a beat)
or excuse a silent one (a `bye` counts only when sealed). Sockets bind to the address of the interface
Horovod uses (HOROVOD_GLOO_IFACE) where known.
"""
from __future__ import annotations

import os
import select
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil

from hvdtrain.distributed import collectives, control_wire
from hvdtrain.distributed.control_wire import HEARTBEAT_S, MAX_DATAGRAM, PEER
from hvdtrain.distributed.runtime import world
from hvdtrain.environment import process

UNHEARD_S = 10   # a peer not heard from this long after the start is reported once, and never judged
# Under mpirun, a rank that exits starts mpirun's abort, which then waits for the lost host's daemon to
# answer, for ever. Staying alive this long after the line keeps mpirun's link to that host idle, so the
# TCP keepalives `hvdtrain launch` sets (settings.MPIRUN_KEEPALIVE) let mpirun give up on it 50-55 s after
# the cut and end the job itself.
MPIRUN_GRACE_S = 15
LOST_EXIT = 1   # like any failed rank: horovodrun and mpirun then end the others
BEAT = "beat"
BYE = "bye"     # a rank that finished says so, so its silence afterwards is not a loss
IFACE_ENV = "HOROVOD_GLOO_IFACE"   # the interface horovodrun picked for the job's traffic


@dataclass(frozen=True)
class Peer:
    rank: int
    host: str
    addresses: tuple[str, ...]
    port: int
    sender: str = ""   # its sender id on the wire, fresh for each watch (default: its rank)

    @property
    def id(self) -> str:
        return self.sender or str(self.rank)

    def where(self) -> str:
        return f"rank {self.rank} on host {self.host}" + (f" ({self.addresses[0]})" if self.addresses else "")


def own_addresses() -> list[str]:
    """This host's IPv4 addresses, loopback last (for peers on the same host)."""
    found = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
             if a.family == socket.AF_INET and not a.address.startswith("127.")]
    return found + ["127.0.0.1"]


def job_address(env: dict[str, str] | os._Environ[str]) -> str | None:
    """The IPv4 address of the interface Horovod uses (horovodrun sets HOROVOD_GLOO_IFACE), or None."""
    found = [a.address for a in psutil.net_if_addrs().get(env.get(IFACE_ENV, ""), []) if a.family == socket.AF_INET]
    return found[0] if found else None


def lost_message(silent: list[tuple[Peer, float]], timeout_s: int) -> str:
    """The one line a job ends with when peers stay silent.

    Example:
        >>> lost_message([(Peer(1, "node2", ("10.0.0.2",), 5000), 45.2)], 45)[:72]
        'hvdtrain: error: rank 1 on host node2 (10.0.0.2) has not answered for 45'
    """
    who = ", ".join(peer.where() for peer, _ in silent)
    hosts = ", ".join(sorted({peer.host for peer, _ in silent}))
    longest = max(seconds for _, seconds in silent)
    return (f"hvdtrain: error: {who} has not answered for {longest:.0f} s (host unreachable, or the process "
            f"frozen); this job stops (--peer-timeout-s {timeout_s}). Lost host(s): {hosts}. When it is back, "
            "rerun with --resume auto")


class PeerWatch:
    """Heartbeats to and from `peers`, sealed with `key`; ends this process when one stays silent for `timeout_s`.

    `sender` is this rank's id on the wire (default: its rank); `inbox.rejected` counts what was dropped.
    """

    def __init__(self, rank: int, key: bytes, peers: list[Peer], sock: socket.socket, timeout_s: int,
                 sender: str = "") -> None:
        self.rank, self.peers, self.sock, self.timeout_s = rank, peers, sock, timeout_s
        self.seal = control_wire.Sender(key, PEER, sender or str(rank))
        self.ranks = {peer.id: peer.rank for peer in peers}
        self.inbox = control_wire.Inbox(key, PEER, set(self.ranks), "peer watch")
        self.started = time.monotonic()
        # None until a peer's first heartbeat: one never heard is not judged (UDP may be filtered between
        # hosts; a watch that cannot hear must not end a healthy job), only reported once.
        self.heard: dict[int, float | None] = {peer.rank: None for peer in peers}
        self.unheard_told = False
        self.warned: set[int] = set()
        self.done = threading.Event()
        started = process.from_env(os.environ)
        self.under_mpirun = started is not None and started.launcher == "openmpi"
        self.thread = threading.Thread(target=self._loop, name="hvdtrain-peer-watch", daemon=True)

    def silent(self, at_least_s: float) -> list[tuple[Peer, float]]:
        now = time.monotonic()
        heard = {rank: at for rank, at in self.heard.items() if at is not None}
        return [(peer, now - heard[peer.rank]) for peer in self.peers
                if peer.rank in heard and now - heard[peer.rank] >= at_least_s]

    def stop(self) -> None:
        self._send(BYE)
        self.done.set()
        self.thread.join(timeout=5)
        self.sock.close()

    def _send(self, what: str) -> None:
        data = self.seal.seal(what)
        for peer in self.peers:
            for address in peer.addresses:
                try:
                    self.sock.sendto(data, (address, peer.port))
                except OSError:
                    pass   # no route while the link is down: that is what the silence will show

    def _receive(self, until: float) -> None:
        """Take in datagrams until `until` (the next beat), never past it: a flood cannot delay a beat."""
        while True:
            ready, _, _ = select.select([self.sock], [], [], max(until - time.monotonic(), 0))
            if not ready:
                return
            try:
                data = self.sock.recv(MAX_DATAGRAM + 1)
            except OSError:
                return
            message = self.inbox.open(data)
            if message is not None:
                self.hear(self.ranks[message.sender], message.body)
            if time.monotonic() >= until:
                return

    def hear(self, rank: int, what: str) -> None:
        if what == BYE:
            self.heard.pop(rank, None)
        elif what == BEAT and rank in self.heard:
            self.heard[rank] = time.monotonic()

    def _loop(self) -> None:
        next_beat = time.monotonic()
        while not self.done.is_set():
            now = time.monotonic()
            if now >= next_beat:
                self._send(BEAT)
                next_beat = now + HEARTBEAT_S
                self._judge()
            self._receive(next_beat)

    def _speaks_for_the_job(self) -> bool:
        """The lowest rank among this one and those it still hears from."""
        hearing = [rank for rank, at in self.heard.items()
                   if at is not None and time.monotonic() - at < self.timeout_s / 3]
        return self.rank < min(hearing, default=self.rank + 1)

    def _judge(self) -> None:
        unheard = [peer for peer in self.peers if self.heard.get(peer.rank, 0.0) is None]
        if unheard and not self.unheard_told and time.monotonic() - self.started > UNHEARD_S:
            self.unheard_told = True
            if self.rank == 0:
                print(f"hvdtrain: warning: no heartbeat from {', '.join(p.where() for p in unheard)} in "
                      f"{UNHEARD_S} s (UDP between hosts filtered?); a lost host there is not named, and only "
                      "Gloo's timeout ends the job (nothing under MPI)", file=sys.stderr, flush=True)
        lost = self.silent(self.timeout_s)
        if lost:
            if self._speaks_for_the_job():
                print(lost_message(lost, self.timeout_s), file=sys.stderr, flush=True)
            if self.under_mpirun:
                time.sleep(MPIRUN_GRACE_S)
            # From this thread: the training thread may be blocked in a collective that never returns.
            os._exit(LOST_EXIT)
        for peer, seconds in self.silent(self.timeout_s / 3):
            if peer.rank not in self.warned and self._speaks_for_the_job():
                print(f"hvdtrain: warning: {peer.where()} has not answered for {seconds:.0f} s (unreachable or "
                      f"frozen?); the job stops if it stays silent for {self.timeout_s} s", file=sys.stderr,
                      flush=True)
            self.warned.add(peer.rank)
        for rank in list(self.warned):
            at = self.heard.get(rank)
            if at is not None and time.monotonic() - at < HEARTBEAT_S * 2:
                self.warned.discard(rank)   # back: a later silence warns again


def start(timeout_s: int) -> PeerWatch | None:
    """Start watching every other rank (a collective: every rank calls it); None when off or alone."""
    me = world()
    if timeout_s <= 0 or me.size == 1:
        return None
    bound = job_address(os.environ)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((bound or "0.0.0.0", 0))
    host = socket.gethostname()
    # Over Horovod's own channel: where each rank listens, its fresh sender id, the fingerprint of the key its
    # launcher gave it, and from rank 0 a fresh key, used only when the ranks do not all hold the same launcher key
    # (plain horovodrun): the launcher's key itself never travels. Nothing secret is sent over UDP.
    launcher_key = control_wire.key_from_env(os.environ)
    mine = {"rank": me.rank, "host": host, "addresses": [bound] if bound else own_addresses(),
            "port": sock.getsockname()[1], "sender": f"{me.rank}.{control_wire.new_key()[:16]}",
            "key_id": control_wire.key_id(launcher_key) if launcher_key else "",
            "key": control_wire.new_key() if me.rank == 0 else ""}
    everyone = collectives.allgather_object(mine, name="hvdtrain.peer_watch")
    shared = launcher_key is not None and all(e["key_id"] == mine["key_id"] for e in everyone)
    key = launcher_key if shared and launcher_key else everyone[0]["key"].encode()   # one job's, not another's
    peers = [Peer(e["rank"], e["host"], tuple(a for a in e["addresses"] if e["host"] == host or a != "127.0.0.1"),
                  e["port"], e["sender"]) for e in everyone if e["rank"] != me.rank]
    watch = PeerWatch(me.rank, key, peers, sock, timeout_s, mine["sender"])
    watch.thread.start()
    return watch


@contextmanager
def watching(timeout_s: int) -> Iterator[PeerWatch | None]:
    """Watch the peers while inside; stop (and tell them) on the way out, however it is left."""
    watch = start(timeout_s)
    try:
        yield watch
    finally:
        if watch is not None:
            watch.stop()
