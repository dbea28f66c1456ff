"""The control plane's wire format (hvdtrain/distributed/control_wire.py, issue 36): what is sealed opens, and
everything else (forged, replayed, truncated, garbage, oversized, wrong key, wrong channel, unknown sender)
is counted and dropped, on real sockets as well as in memory."""
from __future__ import annotations

import ast
import doctest
import hashlib
import hmac
import os
import socket
import struct
import time
from pathlib import Path

import pytest

import hvdtrain.distributed.control_wire as wire
from hvdtrain.environment import credentials, secrets_file

KEY = b"k" * 64


def test_docstring_examples_are_true():
    result = doctest.testmod(wire)
    assert result.attempted and not result.failed


def test_the_key_is_a_credential_and_the_secrets_file_variable_is_the_launchers():
    assert credentials.is_credential(wire.CONTROL_KEY_ENV)


def test_the_key_comes_from_the_secrets_file_through_its_one_parser(tmp_path):
    """The file a launcher writes (environment/secrets_file.py), read back by that module's parser: a comment or a
    blank line is no key line, and a file that is not the format gives no key (loading it says why)."""
    path = secrets_file.write_secrets_file({"HF_TOKEN": "hf_x", wire.CONTROL_KEY_ENV: "ab12"}, tmp_path)
    path.write_text(f"# {wire.CONTROL_KEY_ENV}=old\n\n" + path.read_text())
    assert wire.key_from_env({secrets_file.SECRETS_FILE_ENV: str(path)}) == b"ab12"
    path.write_text(f"{wire.CONTROL_KEY_ENV}=ab12\nnot a line\n")
    assert wire.key_from_env({secrets_file.SECRETS_FILE_ENV: str(path)}) is None
    assert wire.key_from_env({secrets_file.SECRETS_FILE_ENV: str(tmp_path / "gone.env")}) is None


def test_the_secrets_file_variable_is_defined_once():
    package = Path(wire.__file__).resolve().parents[1]
    defined = [str(path.relative_to(package)) for path in package.rglob("*.py")
               for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "SECRETS_FILE_ENV" for t in node.targets)]
    assert defined == ["environment/secrets_file.py"]


def test_a_sealed_datagram_opens_once_and_only_on_its_channel():
    sender = wire.Sender(KEY, wire.PEER, "1.abc")
    first, second = sender.seal("beat"), sender.seal("bye")
    assert len(first) <= wire.MAX_DATAGRAM
    inbox = wire.Inbox(KEY, wire.PEER, {"1.abc"})
    got = inbox.open(first)
    assert got is not None and (got.channel, got.sender, got.body) == (wire.PEER, "1.abc", "beat")
    assert inbox.open(first) is None   # replayed
    assert inbox.open(second).body == "bye"
    assert inbox.open(second) is None and inbox.open(first) is None   # older than the last: replayed too
    assert inbox.rejected == {"replayed": 3}
    assert wire.Inbox(KEY, wire.TO_DRIVER).open(sender.seal("beat")) is None    # a peer's beat is no worker's
    assert wire.Inbox(KEY, wire.PEER, {"0.zz"}).open(sender.seal("beat")) is None   # not a sender of this watch


def test_sequence_numbers_keep_growing_for_a_restarted_sender():
    before = wire.Sender(KEY, wire.TO_DRIVER, "node1/0/7")
    inbox = wire.Inbox(KEY, wire.TO_DRIVER)
    assert inbox.open(before.seal("beat")) is not None
    again = wire.Sender(KEY, wire.TO_DRIVER, "node1/0/7")   # the same id from a new process: still newer
    assert inbox.open(again.seal("beat")) is not None


def forgeries(good: bytes) -> dict[str, bytes]:
    body = good[:-wire.TAG_BYTES]
    flipped = bytearray(good)
    flipped[len(wire.MAGIC) + 3] ^= 1   # a bit of the sequence number
    resealed_with = hmac.new(b"another job", body, hashlib.sha256).digest()
    head = struct.pack(">4scQB", wire.MAGIC, wire.PEER, 1, 1)
    return {
        "truncated": good[:-1],
        "no tag": body,
        "empty": b"",
        "garbage": os.urandom(80),
        "old text format": b"hvdtrain-peer t0k 1 beat",
        "old json": b'{"token": "x", "host": "h", "slot": 0, "pid": 1, "timeout_s": 0, "bye": false}',
        "bit flipped": bytes(flipped),
        "wrong key": body + resealed_with,
        "tag zeroed": body + bytes(wire.TAG_BYTES),
        "oversized": good + b"x" * wire.MAX_DATAGRAM,
        "lengths lie": head + b"1" + b"\xff" + hmac.new(KEY, head + b"1\xff", hashlib.sha256).digest(),
        "not utf-8": (lambda d: d + hmac.new(KEY, d, hashlib.sha256).digest())(head + b"\xff\x00"),
    }


def test_forged_truncated_garbage_oversized_and_wrongly_keyed_datagrams_are_counted_and_dropped(capsys):
    good = wire.Sender(KEY, wire.PEER, "1").seal("beat")
    inbox = wire.Inbox(KEY, wire.PEER)
    for name, data in forgeries(good).items():
        assert inbox.open(data) is None, name
    assert inbox.total_rejected() == len(forgeries(good))
    assert set(inbox.rejected) <= set(wire.REASONS) and inbox.rejected["unauthenticated"] >= 4
    assert inbox.rejected["oversized"] == 1 and inbox.rejected["malformed"] >= 4
    assert inbox.open(good) is not None   # none of that cost the real one its place
    assert capsys.readouterr().err.count("hvdtrain: warning:") == 1   # one line, the first time
    assert wire.Inbox(None, wire.PEER).open(good) is None   # no key: nothing is believed


def test_seal_refuses_what_does_not_fit():
    with pytest.raises(ValueError):
        wire.seal(KEY, wire.PEER, "x" * 300, 1, "beat")
    with pytest.raises(ValueError):
        wire.seal(KEY, wire.PEER, "x", -1, "beat")


def test_over_real_sockets_only_the_sealed_datagrams_get_through():
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(5)
    attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    inbox = wire.Inbox(KEY, wire.PEER)
    good = wire.Sender(KEY, wire.PEER, "1").seal("beat")
    try:
        sent = [good, *forgeries(good).values(), good]   # the second good one is a replay
        for data in sent:
            attacker.sendto(data, receiver.getsockname())
        opened = [inbox.open(receiver.recv(wire.MAX_DATAGRAM + 1)) for _ in sent]
    finally:
        receiver.close()
        attacker.close()
    assert [m is not None for m in opened] == [True] + [False] * (len(sent) - 1)
    assert inbox.rejected["replayed"] == 1


def test_the_key_comes_from_the_environment_or_the_launchers_secrets_file(tmp_path):
    path = tmp_path / "s.env"
    path.write_text("HF_TOKEN=x\nHVDTRAIN_CONTROL_KEY=abc123\n")
    assert wire.key_from_env({"HVDTRAIN_SECRETS_FILE": str(path)}) == b"abc123"
    assert wire.key_from_env({"HVDTRAIN_CONTROL_KEY": "zz", "HVDTRAIN_SECRETS_FILE": str(path)}) == b"zz"
    assert wire.key_from_env({"HVDTRAIN_SECRETS_FILE": str(tmp_path / "gone")}) is None
    assert len(wire.new_key()) == 64 and wire.new_key() != wire.new_key()


def test_one_datagram_with_a_huge_sequence_number_cannot_silence_a_sender(capsys):
    """Issue 51: seq 2**64-1 under a rank's sender id (a key holder's) made every later beat of that rank read as
    replayed, not even logged, and the job ended blaming a healthy rank."""
    honest = wire.Sender(KEY, wire.PEER, "1.abc")
    inbox = wire.Inbox(KEY, wire.PEER)
    assert inbox.open(honest.seal("beat")) is not None
    assert inbox.open(wire.seal(KEY, wire.PEER, "1.abc", 2 ** 64 - 1, "beat")) is None
    assert inbox.rejected == {"future": 1} and "(future)" in capsys.readouterr().err
    # The furthest a forged number may go: the floor rises to this clock at most, and the next beats are above it.
    assert inbox.open(wire.seal(KEY, wire.PEER, "1.abc", time.time_ns() + wire.WINDOW_NS - 10**9, "beat"))
    time.sleep(0.01)
    assert [inbox.open(honest.seal("beat")) is not None for _ in range(3)] == [True, True, True]


def test_a_datagram_older_than_the_window_or_seen_before_is_refused_one_unseen_and_late_is_taken():
    sender = wire.Sender(KEY, wire.PEER, "1.abc")
    early, late = sender.seal("beat"), sender.seal("beat")
    inbox = wire.Inbox(KEY, wire.PEER)
    assert inbox.open(late) is not None and inbox.open(early) is not None   # reordered on the way: both new
    assert inbox.open(early) is None and inbox.open(late) is None
    stale = wire.seal(KEY, wire.PEER, "1.abc", sender.seq - wire.WINDOW_NS - 1, "beat")
    assert inbox.open(stale) is None and inbox.rejected == {"replayed": 3}


def test_a_flood_of_numbers_from_a_key_holder_keeps_the_memory_per_sender_bounded():
    inbox = wire.Inbox(KEY, wire.PEER)
    base = time.time_ns()
    for n in range(wire.MAX_SEEN + 500):
        inbox.open(wire.seal(KEY, wire.PEER, "x", base - n, "b"))
    assert len(inbox.seen["x"]) <= wire.MAX_SEEN


def test_ranks_compare_key_fingerprints_never_keys():
    assert wire.key_id(KEY) == wire.key_id(KEY) and KEY.decode() not in wire.key_id(KEY)
    assert wire.key_id(KEY) != wire.key_id(b"j" * 64)
