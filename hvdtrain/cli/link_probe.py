"""`hvdtrain doctor --hosts A,B --probe`: each host's link, measured from the launching machine before
training, and the slow one named.

An allreduce runs at the pace of its slowest link: one host on a slower port (a misnegotiated 1 Gbit/s
among 10, a congested uplink) slows every step on every host while nothing fails, and the console only
shows a step time. The probe streams PROBE_MB from each host over the same ssh that horovodrun uses,
timed from the first byte (ssh's handshake excluded), and names a host whose throughput is under
SLOW_FRACTION of the fastest. ssh's encryption caps what it can see (a few hundred MB/s a core), so it
finds a host that is slow relative to the others, not the absolute speed of a fast network.
"""
from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass

from hvdtrain.errors import HostsError

PROBE_MB = 16
SLOW_FRACTION = 0.5
CHUNK = 1 << 16


@dataclass(frozen=True)
class Reading:
    host: str
    mb_per_s: float


def host_names(text: str) -> list[str]:
    """Host names of a horovodrun -H string ('a:2,b:1') or a plain list ('a,b').

    Example:
        >>> host_names("node1:2, node2")
        ['node1', 'node2']
    """
    names = [part.strip().split(":", 1)[0] for part in text.split(",") if part.strip()]
    if not names or any(not name for name in names):
        raise HostsError(f"--hosts {text!r}: expected host names separated by commas, e.g. node1,node2 "
                         "(or horovodrun's node1:2,node2:2)")
    return names


def measure(host: str, port: int | None, key: str | None, megabytes: int = PROBE_MB, timeout: float = 60) -> Reading:
    """Stream `megabytes` of zeros from `host` over ssh; MB/s from the first byte to the last."""
    wanted = megabytes << 20
    # AES-GCM first: with AES-NI it costs far less CPU a byte than ssh's default ChaCha20, so a loaded
    # machine's CPU caps the figures less (measured here: 31-94 MB/s with ChaCha20 on a 1 Gbit/s link).
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o",
           "Ciphers=aes128-gcm@openssh.com,chacha20-poly1305@openssh.com", *(["-p", str(port)] if port else []),
           *(["-i", key] if key else []), host, f"head -c {wanted} /dev/zero"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    got, first = 0, None
    deadline = time.monotonic() + timeout
    try:
        while got < wanted and time.monotonic() < deadline:
            chunk = proc.stdout.read1(CHUNK)   # type: ignore[attr-defined]
            if not chunk:
                break
            first = first or time.monotonic()
            got += len(chunk)
        done = time.monotonic()
    finally:
        proc.kill()
        _, err = proc.communicate()
    if got < wanted or first is None:
        why = err.decode(errors="replace").strip().splitlines()[-1:] or ["no data"]
        raise HostsError(f"probe: ssh {host} sent {got >> 20} of {megabytes} MB ({why[0]}); check that "
                         "`ssh HOST true` works from here with the same -p/-i as horovodrun")
    return Reading(host, (got - CHUNK) / (1 << 20) / max(done - first, 1e-6))


def slow_hosts(readings: list[Reading], fraction: float = SLOW_FRACTION) -> list[Reading]:
    """Hosts under `fraction` of the fastest.

    Example:
        >>> slow_hosts([Reading("a", 110.0), Reading("b", 11.0), Reading("c", 95.0)])
        [Reading(host='b', mb_per_s=11.0)]
    """
    fastest = max(r.mb_per_s for r in readings)
    return [r for r in readings if r.mb_per_s < fraction * fastest]


def main(hosts: str, port: int | None, key: str | None) -> int:
    readings = [measure(host, port, key) for host in host_names(hosts)]
    fastest = max(readings, key=lambda r: r.mb_per_s)
    for reading in readings:
        print(f"{reading.host:>20}: {reading.mb_per_s:8.1f} MB/s over ssh ({reading.mb_per_s / fastest.mb_per_s:.2f} "
              "of the fastest)")
    slow = slow_hosts(readings)
    for reading in slow:
        print(f"hvdtrain: error: host {reading.host}'s link is slow: {reading.mb_per_s:.1f} MB/s, "
              f"{reading.mb_per_s / fastest.mb_per_s:.2f} x {fastest.host}'s; every allreduce runs at the slowest "
              "link's pace, so check its port, cable or route (or leave it out of the hostfile)")
    if not slow:
        print(f"hvdtrain: links even (the slowest at least {SLOW_FRACTION:g} of the fastest)")
    return 1 if slow else 0
