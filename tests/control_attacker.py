"""`python tests/control_attacker.py ROOT_PID REPORT.json`: attack hvdtrain's UDP control plane from outside the job.

Knows no secret (it never reads the job's secrets file). While ROOT_PID lives, it finds every UDP socket of
ROOT_PID and its descendants (the launcher, the elastic driver, every worker), sniffs the datagrams sent to
them on loopback (a raw AF_PACKET socket: needs root; without it, no replays), and sprays each port with
garbage, oversized and truncated datagrams, the old text and JSON formats (a `bye`, a `dropped`, a beat with
timeout_s 0 or 1e9), forged sealed ones (every channel, a guessed key), and the sniffed datagrams replayed,
truncated and bit-flipped, to their own port and to every other. Writes what it did to REPORT.json.
"""
from __future__ import annotations

import json
import os
import random
import socket
import struct
import sys
import time

import psutil

RATE = 1500   # datagrams per second in all: an attack, not a CPU hog on a 2-core test machine
ETH_P_ALL = 0x0003


def udp_ports(root: int) -> set[tuple[str, int]]:
    try:
        family = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return set()
    found = set()
    for proc in family:
        try:
            for conn in proc.net_connections(kind="udp4"):
                address = "127.0.0.1" if conn.laddr.ip == "0.0.0.0" else conn.laddr.ip
                found.add((address, conn.laddr.port))
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


def main(root: int, report_path: str) -> None:
    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    out.bind(("127.0.0.1", 0))
    own = out.getsockname()[1]
    raw = sniffer()
    sniffed: list[tuple[int, bytes]] = []
    seen: set[tuple[str, int]] = set()
    sent = replayed = 0
    next_scan = 0.0
    targets: list[tuple[str, int]] = []
    while psutil.pid_exists(root) and psutil.Process(root).status() != psutil.STATUS_ZOMBIE:
        if time.monotonic() >= next_scan:
            targets = sorted(udp_ports(root))
            seen |= set(targets)
            next_scan = time.monotonic() + 0.5
        if raw is not None:
            sniff(raw, {port for _, port in targets}, own, sniffed)
        batch = forgeries()
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
                   "could_sniff": raw is not None}, report)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
