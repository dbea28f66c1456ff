"""The one wire format of hvdtrain's own UDP control plane: the peer watch (rank to rank, peer_watch.py), the
elastic workers' heartbeats to the driver and the driver's answers (driver_heartbeat.py, launcher/worker_watch.py).

Security model: MPI and Gloo trust the network; what hvdtrain adds on top authenticates itself. Every
datagram carries an HMAC-SHA256 over all of it with a per-job key (checked with hmac.compare_digest),
its channel (so one kind cannot be replayed as another), a sender id and a sequence number that only
grows per sender (so a sniffed datagram replayed later is refused). A datagram that is oversized,
malformed, unauthenticated (no key, another job's key, forged) or replayed is dropped and counted in
`Inbox.rejected`; the first such one per process gets one warning line. Nothing that fails these checks can
end, stall or keep alive a worker.

Layout (big-endian), at most MAX_DATAGRAM bytes:
    b"HVC1" | channel: 1 byte | seq: u64 | sender length: u8 | sender (UTF-8) | body length: u8 | body (UTF-8)
    | HMAC-SHA256(key, everything before): 32 bytes

The key never rides on a command line: `hvdtrain launch` puts it in the 0600 secrets file (a variable
named CONTROL_KEY_ENV, a credential by credentials.is_credential), Ray's elastic driver inside the pickled job,
and the peer watch without a key of the launcher's agrees one over Horovod itself at start-up.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hvdtrain.environment.secrets_file import SECRETS_FILE_ENV, read_secrets_file
from hvdtrain.errors import UserError

CONTROL_KEY_ENV = "HVDTRAIN_CONTROL_KEY"   # the per-job key; a credential: never on a command line
HEARTBEAT_S = 1.0     # every heartbeat of the control plane, rank to rank and worker to driver
MAX_DATAGRAM = 512
MAGIC = b"HVC1"
TAG_BYTES = 32
_HEAD = struct.Struct(">4scQB")

PEER = b"P"          # rank to rank (peer_watch.py)
TO_DRIVER = b"W"     # an elastic worker's heartbeat to the driver
FROM_DRIVER = b"D"   # the driver's answer to a worker it has dropped


class Rejected(ValueError):
    """A datagram that is not ours; `reason` is one of REASONS."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


REASONS = ("oversized", "malformed", "unauthenticated", "replayed", "unexpected", "future")
# How far a sequence number may run ahead of the receiver's clock (clock skew between hosts is far smaller), and
# how far below a sender's highest one a number still counts as new (datagrams reordered or late).
WINDOW_NS = 300 * 10**9
MAX_SEEN = 4096


@dataclass(frozen=True)
class Message:
    channel: bytes
    sender: str
    seq: int
    body: str


def new_key() -> str:
    """A fresh per-job key, as text fit for an environment variable or a secrets file line."""
    return secrets.token_hex(32)


def key_from_env(env: Mapping[str, str]) -> bytes | None:
    """The job's key: CONTROL_KEY_ENV, else that line of the secrets file a launcher named; None when neither.

    Example:
        >>> key_from_env({"HVDTRAIN_CONTROL_KEY": "ab12"}), key_from_env({})
        (b'ab12', None)
    """
    value = env.get(CONTROL_KEY_ENV, "")
    if not value and env.get(SECRETS_FILE_ENV):
        try:   # a worker whose own code never loaded the file (a user script under `hvdtrain launch`)
            value = read_secrets_file(Path(env[SECRETS_FILE_ENV])).get(CONTROL_KEY_ENV, "")
        except UserError:   # unreadable here, or not the format: no key from it (loading it reports why)
            value = ""
    return value.encode() if value else None


def seal(key: bytes, channel: bytes, sender: str, seq: int, body: str) -> bytes:
    """One datagram. Raises ValueError when it would not fit the format."""
    who, what = sender.encode(), body.encode()
    if len(channel) != 1 or len(who) > 255 or len(what) > 255 or not 0 <= seq < 2 ** 64:
        raise ValueError(f"control datagram out of bounds: sender {sender!r}, body {body!r}, seq {seq}")
    data = _HEAD.pack(MAGIC, channel, seq, len(who)) + who + bytes([len(what)]) + what
    return data + hmac.new(key, data, hashlib.sha256).digest()


def unseal(key: bytes | None, data: bytes) -> Message:
    """The message in `data`, authenticated; raises Rejected (no replay check: that is Inbox's)."""
    if len(data) > MAX_DATAGRAM:
        raise Rejected("oversized")
    if len(data) < _HEAD.size + 1 + TAG_BYTES or not data.startswith(MAGIC):
        raise Rejected("malformed")
    signed, tag = data[:-TAG_BYTES], data[-TAG_BYTES:]
    if key is None or not hmac.compare_digest(hmac.new(key, signed, hashlib.sha256).digest(), tag):
        raise Rejected("unauthenticated")
    _, channel, seq, who_len = _HEAD.unpack_from(signed)
    rest = signed[_HEAD.size:]
    if len(rest) < who_len + 1 or len(rest) != who_len + 1 + rest[who_len]:
        raise Rejected("malformed")   # signed by a key holder, yet not our layout: refused all the same
    try:
        return Message(channel, rest[:who_len].decode(), seq, rest[who_len + 1:].decode())
    except UnicodeDecodeError:
        raise Rejected("malformed") from None


class Sender:
    """Seals datagrams of one sender on one channel, each with a larger sequence number than the last.

    Numbers start at the clock (ns), so a sender id reused by a restarted process still goes on upwards.
    """

    def __init__(self, key: bytes, channel: bytes, sender: str) -> None:
        self.key, self.channel, self.sender = key, channel, sender
        self.seq = 0
        self.lock = threading.Lock()

    def seal(self, body: str) -> bytes:
        with self.lock:
            self.seq = max(self.seq + 1, time.time_ns())
            return seal(self.key, self.channel, self.sender, self.seq, body)


def key_id(key: bytes) -> str:
    """A short public fingerprint of a key: ranks compare it to learn that they hold the same key, never the key.

    Example:
        >>> key_id(b"ab12") == key_id(b"ab12") != key_id(b"ab13")
        True
    """
    return hashlib.sha256(b"hvdtrain-key-id\0" + key).hexdigest()[:16]


class Inbox:
    """Opens datagrams for one channel: authenticated, not replayed; counts and drops everything else.

    Replays: a sender's numbers start at its clock (ns) and only grow, so a datagram is new when its number was not
    seen from that sender and is above the sender's highest minus WINDOW_NS. A number more than WINDOW_NS past this
    receiver's clock is refused ("future"): without that bound one datagram of a key holder with seq 2**64-1 made
    every later beat of that sender read as replayed, silencing a healthy rank. With it, such a datagram raises the
    floor to at most this clock: the sender's next beats are above it.

    Args:
        key: the job's key (None: every datagram is refused).
        channel: the one channel this receiver listens to.
        senders: when given, the only sender ids accepted (others: "unexpected").
        label: names the receiver in its one warning line.
    """

    def __init__(self, key: bytes | None, channel: bytes, senders: set[str] | None = None,
                 label: str = "control socket") -> None:
        self.key, self.channel, self.senders, self.label = key, channel, senders, label
        self.last: dict[str, int] = {}                 # each sender's highest number
        self.seen: dict[str, set[int]] = {}            # its numbers within WINDOW_NS of that
        self.floor: dict[str, int] = {}                # at or below: not new (numbers forgotten under a flood)
        self.rejected: Counter[str] = Counter()
        self.warned = False

    def open(self, data: bytes) -> Message | None:
        try:
            message = unseal(self.key, data)
            if message.channel != self.channel or (self.senders is not None and message.sender not in self.senders):
                raise Rejected("unexpected")
            if message.seq > time.time_ns() + WINDOW_NS:
                raise Rejected("future")
            highest = self.last.get(message.sender, -1)
            seen = self.seen.setdefault(message.sender, set())
            floor = max(highest - WINDOW_NS, self.floor.get(message.sender, -1))
            if message.seq <= floor or message.seq in seen:
                raise Rejected("replayed")
        except Rejected as no:
            self.reject(no.reason)
            return None
        seen.add(message.seq)
        if message.seq > highest:
            self.last[message.sender] = highest = message.seq
        if len(seen) > MAX_SEEN:   # numbers out of the window go; under a key holder's flood, the oldest half too
            seen.difference_update({n for n in seen if n <= highest - WINDOW_NS})
            if len(seen) > MAX_SEEN // 2:
                forgotten = sorted(seen)[:len(seen) - MAX_SEEN // 2]
                seen.difference_update(forgotten)
                self.floor[message.sender] = forgotten[-1]   # a forgotten number must not count as new
        return message

    def reject(self, reason: str) -> None:
        self.rejected[reason] += 1
        # A late or reordered heartbeat reads as replayed too: only the others are worth a line.
        if reason != "replayed" and not self.warned:
            self.warned = True
            print(f"hvdtrain: warning: the {self.label} (pid {os.getpid()}) dropped a datagram that is not this "
                  f"job's ({reason}); such datagrams are counted and ignored", file=sys.stderr, flush=True)

    def total_rejected(self) -> int:
        return sum(self.rejected.values())
