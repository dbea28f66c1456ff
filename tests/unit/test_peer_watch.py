"""The peer watch's heartbeats for real, over loopback UDP, without Horovod: who is heard, who is
silent, a finished rank's goodbye, and the one line a lost host gets (issue 29); and what a sender without
the job's key can do to it: nothing (issue 36)."""
from __future__ import annotations

import os
import socket
import threading
import time

import hvdtrain.distributed.control_wire as wire
from hvdtrain.distributed.peer_watch import Peer, PeerWatch, lost_message

LONG = 3600   # no verdict during the test: the watch would end the test process
KEY = b"job-key" * 8


def bound() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    return sock


def pair(key: bytes = KEY, other_key: bytes | None = None) -> tuple[PeerWatch, PeerWatch]:
    a, b = bound(), bound()
    peer_a = Peer(0, "node1", ("127.0.0.1",), a.getsockname()[1], "0.aa")
    peer_b = Peer(1, "node2", ("127.0.0.1",), b.getsockname()[1], "1.bb")
    return (PeerWatch(0, key, [peer_b], a, LONG, "0.aa"),
            PeerWatch(1, other_key or key, [peer_a], b, LONG, "1.bb"))


def test_ranks_that_beat_are_heard_and_a_goodbye_ends_the_watch_on_that_rank():
    first, second = pair()
    first.thread.start()
    second.thread.start()
    try:
        time.sleep(2.5)
        assert first.silent(2) == [] and second.silent(2) == []
        second.stop()
        time.sleep(0.5)
        assert 1 not in first.heard   # finished, not lost: its silence from now on is no fault
        assert first.silent(0) == []
        assert first.inbox.total_rejected() == 0
    finally:
        first.stop()


def test_a_peer_that_never_answers_is_named_by_rank_and_host():
    watch, frozen = pair()
    watch.thread.start()
    frozen._send("beat")   # one heartbeat, then nothing: its watch never runs, like a process stopped
    try:
        time.sleep(1.5)
        silent = watch.silent(1)
        assert [peer.rank for peer, _ in silent] == [1]
        line = lost_message(silent, 45)
        assert line.startswith("hvdtrain: error: rank 1 on host node2 (127.0.0.1) has not answered for")
        assert "Lost host(s): node2." in line and "--resume auto" in line and "\n" not in line
    finally:
        watch.stop()
        frozen.sock.close()


def test_another_jobs_heartbeats_are_ignored_and_a_peer_never_heard_is_not_judged():
    ours, theirs = pair(KEY, b"another job's key")
    ours.thread.start()
    theirs.thread.start()
    try:
        time.sleep(1.5)
        assert ours.heard[1] is None    # never heard (another job's key): UDP may be filtered, so
        assert ours.silent(0) == []     # its silence is no verdict
        assert ours.inbox.rejected["unauthenticated"] >= 1
    finally:
        ours.stop()
        theirs.stop()


def test_a_flood_of_forged_replayed_and_malformed_datagrams_neither_stops_nor_silences_nor_excuses_a_rank():
    """Without the key: a forged bye does not excuse a frozen rank, replayed beats do not keep it alive, and a
    flood of garbage neither kills the watch's thread nor delays its own beats (so its peer never sees it silent)."""
    watch, frozen = pair()
    listener = bound()   # a third "rank" that only listens: does `watch` keep beating under the flood?
    watch.peers.append(Peer(2, "node3", ("127.0.0.1",), listener.getsockname()[1], "2.cc"))
    target = watch.sock.getsockname()
    sniffed = [frozen.seal.seal("beat") for _ in range(3)]
    stop = threading.Event()

    def spray() -> None:
        attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        forged_bye = wire.seal(b"guessed key", wire.PEER, "1.bb", 2 ** 62, "bye")
        junk = [b"", b"hvdtrain-peer t 1 bye", b"hvdtrain-peer t x beat", os.urandom(600), forged_bye,
                b"HVC1" + os.urandom(60)]
        while not stop.is_set():
            for data in junk + sniffed:
                try:
                    attacker.sendto(data, target)
                except OSError:
                    pass
        attacker.close()

    watch.thread.start()
    for data in sniffed[:1]:   # the frozen rank's last real beat, then only the attacker
        frozen.sock.sendto(data, target)
    sprayers = [threading.Thread(target=spray, daemon=True) for _ in range(2)]
    for thread in sprayers:
        thread.start()
    beats = []
    listener.settimeout(0.5)
    try:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            try:
                beats.append((time.monotonic(), wire.Inbox(KEY, wire.PEER).open(listener.recv(1024))))
            except OSError:
                pass
    finally:
        stop.set()
        for thread in sprayers:
            thread.join()
    try:
        assert watch.thread.is_alive()
        assert 1 in watch.heard and watch.heard[1] is not None   # not excused by the forged bye
        assert [peer.rank for peer, _ in watch.silent(2.5)] == [1]   # nor kept alive by the replays
        assert watch.inbox.rejected["unauthenticated"] > 0 and watch.inbox.rejected["malformed"] > 0
        assert watch.inbox.rejected["oversized"] > 0 and watch.inbox.rejected["replayed"] > 0
        times = [at for at, message in beats if message is not None and message.body == "beat"]
        assert len(times) >= 3 and max(b - a for a, b in zip(times, times[1:], strict=False)) < 2.0, times
    finally:
        watch.stop()
        frozen.sock.close()
        listener.close()
