"""The peer watch's heartbeats for real, over loopback UDP, without Horovod: who is heard, who is
silent, a finished rank's goodbye, and the one line a lost host gets (issue 29)."""
from __future__ import annotations

import socket
import time

from hvdtrain.distributed.peer_watch import Peer, PeerWatch, lost_message

LONG = 3600   # no verdict during the test: the watch would end the test process


def bound() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    return sock


def pair(token: str = "t") -> tuple[PeerWatch, PeerWatch]:
    a, b = bound(), bound()
    peer_a = Peer(0, "node1", ("127.0.0.1",), a.getsockname()[1])
    peer_b = Peer(1, "node2", ("127.0.0.1",), b.getsockname()[1])
    return PeerWatch(0, token, [peer_b], a, LONG), PeerWatch(1, token, [peer_a], b, LONG)


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
    ours, theirs = pair("ours")
    theirs.token = "theirs"
    ours.thread.start()
    theirs.thread.start()
    try:
        time.sleep(1.5)
        assert ours.heard[1] is None    # never heard (another job's token): UDP may be filtered, so
        assert ours.silent(0) == []     # its silence is no verdict
    finally:
        ours.stop()
        theirs.stop()
