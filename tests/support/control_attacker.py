"""`python tests/support/control_attacker.py ROOT_PID REPORT.json [--tcp MARKER] [--key-from DIR]`: attack a running job
from outside it.

UDP (hvdtrain's control plane): while ROOT_PID lives, it finds every UDP socket of ROOT_PID and its descendants
(the launcher, the elastic driver, every worker), sniffs the datagrams sent to them on loopback (a raw AF_PACKET
socket: needs root; without it, no replays), and sprays each port with garbage, oversized and truncated
datagrams, the old text and JSON formats (a `bye`, a `dropped`, a beat with timeout_s 0 or 1e9), forged sealed
ones (every channel, a guessed key), and the sniffed datagrams replayed, truncated and bit-flipped, to their own
port and to every other.

--tcp MARKER: also every listening TCP port of those processes (the elastic rendezvous, Horovod's task and
notification services, Gloo's): pickles that would create MARKER PUT as worker registrations and results,
forged rank_and_size GETs (they would mark workers ready), DELETEs of the rendezvous scopes, bodies declaring
8 GiB, escape sequences in paths, raw garbage. The caller checks MARKER never appears.

--key-from DIR: a key holder (it reads the job's key from the launcher's secrets file in DIR): it seals datagrams
under the sender ids it sniffs with the largest sequence numbers (2**64-1, and the furthest a receiver's clock
allows), which must not silence those senders. Writes what it did to REPORT.json.
"""
from __future__ import annotations

import json
import os
import random
import socket
import struct
import time

import psutil

RATE = 1500   # datagrams per second in all: an attack, not a CPU hog on a 2-core test machine
ETH_P_ALL = 0x0003


def ports(root: int, kind: str) -> set[tuple[str, int]]:
    """(address, port) of every `kind` socket (udp4; tcp4: listening ones) of ROOT_PID and its descendants."""
    try:
        family = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return set()
    found = set()
    for proc in family:
        try:
            for conn in proc.net_connections(kind=kind):
                if kind == "udp4" or conn.status == psutil.CONN_LISTEN:
                    found.add(("127.0.0.1" if conn.laddr.ip == "0.0.0.0" else conn.laddr.ip, conn.laddr.port))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def sniffer() -> socket.socket | None:
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)   # our own spray shares it
        sock.bind(("lo", 0))
        sock.setblocking(False)
        return sock
    except (OSError, AttributeError):
        return None


def sniff(sock: socket.socket, ports: set[int], own: int, into: list[tuple[int, bytes]]) -> None:
    """UDP payloads the job sent to `ports` on loopback (Ethernet-framed there; not ours), the newest 200 kept."""
    while True:
        try:
            frame = sock.recv(65535)
        except BlockingIOError:
            return
        ip = frame[14:]
        if len(ip) < 28 or ip[0] >> 4 != 4 or ip[9] != 17:
            continue
        header = (ip[0] & 0x0F) * 4
        sport, dport, length, _ = struct.unpack(">HHHH", ip[header:header + 8])
        if dport in ports and sport != own:
            into.append((dport, ip[header + 8:header + length]))
            del into[:-200]


def forgeries() -> list[bytes]:
    guessed = os.urandom(32)
    junk = [b"", b"\x00", os.urandom(random.randint(1, 1400)), b"x" * 4000, b"HVC1", b"HVC1" + os.urandom(90),
            b"dropped", b"hvdtrain-peer t 0 bye", b"hvdtrain-peer t 1 bye", b"hvdtrain-peer t x beat",
            json.dumps({"token": "x", "host": "localhost", "slot": 0, "pid": 1, "timeout_s": 0, "bye": False}).encode(),
            json.dumps({"token": "x", "host": "localhost", "slot": 1, "pid": 1, "timeout_s": 1e9}).encode()]
    for channel in (b"P", b"W", b"D"):
        for sender, body in (("0", "bye"), ("1", "bye"), ("driver", "dropped localhost/0/1"),
                             ("localhost/0/1", "beat"), ("1", "beat")):
            who, what = sender.encode(), body.encode()
            head = struct.pack(">4scQB", b"HVC1", channel, 2 ** 63, len(who)) + who + bytes([len(what)]) + what
            junk.append(head + os.urandom(32))
            junk.append(head + guessed)
    return junk


def mangle(data: bytes) -> list[bytes]:
    flipped = bytearray(data)
    if flipped:
        flipped[random.randrange(len(flipped))] ^= 1 << random.randrange(8)
    made = [data, data, data[:-1], data[: len(data) // 2], bytes(flipped), data + b"\x00"]
    words = data.split()
    if len(words) == 4 and words[0] == b"hvdtrain-peer":   # the old clear-text format: its token, reused
        made += [b" ".join([*words[:3], b"bye"]), b" ".join([*words[:2], b"x", b"beat"])]
    return made


class Planted:
    """Unpickling this creates MARKER: the proof that someone unpickled an attacker's bytes."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.marker, "w"))


def tcp_requests(marker: str) -> list[bytes]:
    import base64
    import pickle

    bomb = base64.b64encode(pickle.dumps((Planted(marker), b"k")))
    raw_bomb = pickle.dumps(Planted(marker))

    def http(method: str, path: str, body: bytes = b"", headers: str = "", length: str | None = None) -> bytes:
        size = length if length is not None else str(len(body))
        return (f"{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: {size}\r\n\r\n").encode() + body

    made = [os.urandom(64), raw_bomb, b"\x00" * 16 + raw_bomb, bomb]
    for slot in (0, 1, 2):
        path = f"/worker_addresses/localhost:{slot}"
        made += [http("PUT", path, bomb), http("PUT", path, bomb, "X-Hvdtrain-Token: 00\r\nX-Hvdtrain-Auth: 00\r\n"),
                 http("GET", f"/rank_and_size/localhost:{slot}"), http("PUT", f"/runfunc_result/{slot}", raw_bomb),
                 http("PUT", f"/global/{slot}", b"10.9.9.9:1")]
    made += [http("DELETE", "/global/0"), http("DELETE", "/local_localhost/0"), http("GET", "/runfunc/func"),
             http("PUT", "/runfunc_result/0", b"", length=str(8 * 2**30)), http("PUT", "/global/0", b"", length="-1"),
             http("GET", "/\x1b[2J\x1b]0;owned\x07/x"), http("GET", "/a/b/c/d"),
             b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 200]
    return made


def attack_tcp(targets: list[tuple[str, int]], requests: list[bytes]) -> int:
    sent = 0
    for target in targets:
        for data in requests:
            try:
                with socket.create_connection(target, timeout=1) as conn:
                    conn.sendall(data)
                    sent += 1
                    conn.settimeout(0.5)
                    conn.recv(256)
            except OSError:
                pass
    return sent


def sender_ids(sniffed: list[tuple[int, bytes]]) -> set[tuple[bytes, str]]:
    """(channel, sender id) of the sealed datagrams sniffed: their header is in clear."""
    found = set()
    for _port, data in sniffed:
        if data.startswith(b"HVC1") and len(data) > 14:
            length = data[13]
            try:
                found.add((data[4:5], data[14:14 + length].decode()))
            except UnicodeDecodeError:
                pass
    return found


def key_holder_datagrams(key: bytes, sniffed: list[tuple[int, bytes]]) -> list[bytes]:
    import hashlib
    import hmac

    made = []
    for channel, sender in sender_ids(sniffed):
        for seq in (2 ** 64 - 1, time.time_ns() + 299 * 10**9):
            who, what = sender.encode(), b"beat"
            data = struct.pack(">4scQB", b"HVC1", channel, seq, len(who)) + who + bytes([len(what)]) + what
            made.append(data + hmac.new(key, data, hashlib.sha256).digest())
    return made


def read_key(folder: str) -> bytes | None:
    """The job's key from the launcher's secrets file in `folder`, once it is there."""
    import glob

    for path in glob.glob(os.path.join(folder, ".hvdtrain-secrets-*.env")):
        for line in open(path).read().splitlines():
            if line.startswith("HVDTRAIN_CONTROL_KEY="):
                return line.partition("=")[2].encode()
    return None


def main(root: int, report_path: str, marker: str | None = None, key_from: str | None = None) -> None:
    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    out.bind(("127.0.0.1", 0))
    own = out.getsockname()[1]
    raw = sniffer()
    sniffed: list[tuple[int, bytes]] = []
    seen: set[tuple[str, int]] = set()
    sent = replayed = 0
    next_scan = 0.0
    targets: list[tuple[str, int]] = []
    tcp_seen: set[tuple[str, int]] = set()
    tcp_sent = held_key_sent = 0
    key = None
    next_tcp = 0.0
    requests = tcp_requests(marker) if marker else []
    while psutil.pid_exists(root) and psutil.Process(root).status() != psutil.STATUS_ZOMBIE:
        if time.monotonic() >= next_scan:
            targets = sorted(ports(root, "udp4"))
            seen |= set(targets)
            next_scan = time.monotonic() + 0.5
        if raw is not None:
            sniff(raw, {port for _, port in targets}, own, sniffed)
        if requests and time.monotonic() >= next_tcp:
            found = sorted(ports(root, "tcp4"))
            tcp_seen |= set(found)
            tcp_sent += attack_tcp(found, requests)
            next_tcp = time.monotonic() + 2.0
        batch = forgeries()
        if key_from and key is None:
            key = read_key(key_from)
        if key is not None:
            held = key_holder_datagrams(key, sniffed)
            held_key_sent += len(held) * len(targets)
            batch += held
        for _, data in sniffed[-20:]:
            batch += mangle(data)
        started = time.monotonic()
        for target in targets:
            for data in batch:
                try:
                    out.sendto(data, target)
                    sent += 1
                except OSError:
                    pass
        for _port, data in sniffed[-20:]:   # replays, to their own port and to every other
            for target in targets:
                try:
                    out.sendto(data, target)
                    replayed += 1
                except OSError:
                    pass
        spent = len(targets) * (len(batch) + min(len(sniffed), 20))
        time.sleep(max(spent / RATE - (time.monotonic() - started), 0.05))
    with open(report_path, "w") as report:
        json.dump({"ports": sorted(seen), "sent": sent, "replayed": replayed, "sniffed": len(sniffed),
                   "could_sniff": raw is not None, "tcp_ports": sorted(tcp_seen), "tcp_sent": tcp_sent,
                   "key_holder_sent": held_key_sent, "senders": sorted(s for _, s in sender_ids(sniffed))}, report)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=int)
    parser.add_argument("report")
    parser.add_argument("--tcp", metavar="MARKER")
    parser.add_argument("--key-from")
    options = parser.parse_args()
    main(options.root, options.report, options.tcp, options.key_from)
