"""What the elastic rendezvous accepts: the checks hvdtrain's launchers put in front of Horovod's handler.

Why: Horovod 0.28.1's elastic rendezvous (an HTTP server on the launching host) unpickles the body of any
`PUT /worker_addresses/<host>:<slot>` and then trusts the addresses and notification key in it (it later
connects there and unpickles the answers): whoever reaches the port runs code on the launching host. With
hvdtrain's Horovod patch 0001 (scripts/horovod/patches) each elastic worker signs that registration with the
job's key (HVDTRAIN_CONTROL_KEY, delivered in a 0600 file, never on a command line), and every request of a
worker, Gloo's C++ ones included (patch 0002), carries a token derived from that key. Here, before anything is
decoded:

- a request without the token is refused (a stranger can neither read nor write the Gloo scopes, nor mark a
  worker ready: a forged `GET /rank_and_size/...` could trip the driver's barrier into a reset);
- a body larger than MAX_BODY is refused unread (the server never holds more than that per request);
- a registration must carry the HMAC of its path and body under the job's key (constant-time compare);
- an authenticated body is decoded by an unpickler that builds only plain containers (no class, no call):
  even a key holder cannot make it run code.

Gloo's own rendezvous scopes (`global`, `local_*`, `cross_*`: each rank's raw address bytes) are stored as they
come, never decoded. The token is a bearer proof: someone who can read the job's network traffic can replay it
(as they can read Gloo's tensors): see docs/security.md.

Pure functions: the adapter (distributed/horovod_runner.py) wires them into Horovod's handler.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import io
import pickle
import sys
import threading
from typing import Any

AUTH_HEADER = "X-Hvdtrain-Auth"       # as patch 0001 names them on the worker side
TOKEN_HEADER = "X-Hvdtrain-Token"
REGISTRATION_SCOPE = "worker_addresses"
MAX_BODY = 64 * 1024                  # a registration is ~200 bytes, a Gloo address ~100
_DOMAIN = b"hvdtrain-rendezvous-v1\0"


class Refused(ValueError):
    """A request the rendezvous does not act on; the message says why (for the one count line)."""


def tag(key: bytes, path: str, body: bytes) -> str:
    """The HMAC-SHA256 (hex) a signed registration carries: the same as patch 0001's `rendezvous_tag`.

    Example:
        >>> len(tag(b"k", "/worker_addresses/host1:0", b"body"))
        64
    """
    return hmac.new(key, _DOMAIN + path.encode() + b"\0" + body, hashlib.sha256).hexdigest()


def token(key: bytes) -> str:
    """What every request of a worker of the job carries in TOKEN_HEADER (patch 0001's `rendezvous_token`, sent by
    Gloo's C++ store through patch 0002): proof of the job's key, never the key.

    Example:
        >>> token(b"k") == token(b"k") != token(b"j")
        True
    """
    return hmac.new(key, b"hvdtrain-rendezvous-token-v1", hashlib.sha256).hexdigest()


def check_token(key: bytes | None, header: str | None) -> None:
    """Refused unless the request carries the job's token (constant-time compare). With no job key: refused too."""
    if key is None:
        raise Refused("the job has no key")
    if not header or not hmac.compare_digest(token(key), header.strip()):
        raise Refused("no token of the job's key")


def body_length(header: str | None) -> int:
    """The declared Content-Length, if it is one the rendezvous will read; else Refused (nothing is read).

    Example:
        >>> body_length("120")
        120
    """
    if header is None or not header.strip().isdigit():
        raise Refused("no valid Content-Length")
    length = int(header)
    if length > MAX_BODY:
        raise Refused(f"body of {length} bytes (at most {MAX_BODY})")
    return length


class _PlainUnpickler(pickle.Unpickler):
    """Builds str, bytes, int, float, bool, None, tuples, lists and dicts; refuses every global (so every call)."""

    def find_class(self, module: str, name: str) -> Any:
        raise Refused(f"the body names {module}.{name}")


def _plain(data: bytes) -> Any:
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except Refused:
        raise
    except Exception as err:   # truncated, garbage, unsupported opcode: all just refused
        raise Refused(f"not a plain pickle ({type(err).__name__})") from None


def registration(key: bytes | None, path: str, body: bytes,
                 signature: str | None) -> tuple[str, int, dict[str, list[tuple[str, int]]], bytes]:
    """(host, slot, addresses by interface, the worker's notification key) of a signed registration, else Refused.

    `path` is the request path (`/worker_addresses/<host>:<slot>`), `signature` the AUTH_HEADER value.
    """
    if key is None:
        raise Refused("the job has no key")
    if not signature or not hmac.compare_digest(tag(key, path, body), signature.strip()):
        raise Refused("registration not signed with the job's key")
    parts = path.split("/")
    if len(parts) != 3 or parts[1] != REGISTRATION_SCOPE:
        raise Refused("not a registration path")
    host, sep, slot = parts[2].rpartition(":")
    if not sep or not host or not slot.isdigit():
        raise Refused("registration key is not <host>:<slot>")
    try:
        value = _plain(base64.b64decode(body, validate=True))
    except binascii.Error:
        raise Refused("body is not base64") from None
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], bytes)
            and isinstance(value[0], dict)):
        raise Refused("body is not (addresses, key)")
    addresses: dict[str, list[tuple[str, int]]] = {}
    for interface, pairs in value[0].items():
        if not isinstance(interface, str) or not isinstance(pairs, list):
            raise Refused("addresses are not {interface: [(ip, port)]}")
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)
                    and isinstance(pair[1], int)):
                raise Refused("addresses are not {interface: [(ip, port)]}")
        addresses[interface] = pairs
    return host, int(slot), addresses, value[1]


class RefusedRequests:
    """Counts requests a server of the job refused: one warning line for the first, a count at the end."""

    def __init__(self, what: str) -> None:
        self.what, self.count, self.lock = what, 0, threading.Lock()

    def __call__(self, line: str) -> None:
        with self.lock:
            self.count += 1
            first = self.count == 1
        if first:
            print(f"hvdtrain: warning: {self.what} refused a request ({line}); such requests are counted and "
                  "ignored (docs/security.md)", file=sys.stderr, flush=True)

    def summary(self) -> None:
        if self.count:
            print(f"hvdtrain: warning: {self.what} refused {self.count} request(s) in all", file=sys.stderr,
                  flush=True)


def safe_text(text: str, limit: int = 120) -> str:
    """`text` fit for one terminal line: control characters (escape sequences too) shown as \\xNN, cut at `limit`.

    Example:
        >>> safe_text("/x\\x1b[2J")
        '/x\\\\x1b[2J'
    """
    shown = "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}"
                    for ch in text[:limit])
    return shown + ("..." if len(text) > limit else "")
