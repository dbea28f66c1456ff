"""launcher/rendezvous_auth.py: what the elastic rendezvous accepts, and the worker half (Horovod patch 0001)."""
from __future__ import annotations

import base64
import os
import pickle
import re
import socket
from pathlib import Path

import pytest

from hvdtrain.distributed import rendezvous_auth as auth

KEY = b"0123456789abcdef" * 4
PATH = "/worker_addresses/host1:0"
PATCHES = Path(__file__).resolve().parents[2] / "scripts" / "horovod" / "patches"
PATCH_2 = PATCHES / "0002-gloo-http-store-sends-the-rendezvous-token.patch"


def body_of(value: object) -> bytes:
    return base64.b64encode(pickle.dumps(value))


GOOD = body_of(({"lo": [("127.0.0.1", 4242)], "eth0": [("10.0.0.2", 4242)]}, b"\x01" * 32))


class Planted:
    """Unpickling this creates a file: the proof that someone unpickled an attacker's bytes."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return (Path.touch, (self.marker,))


class Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("this must never run",))


def test_a_signed_registration_is_decoded_into_host_slot_addresses_and_key() -> None:
    host, slot, addresses, key = auth.registration(KEY, PATH, GOOD, auth.tag(KEY, PATH, GOOD))
    assert (host, slot, key) == ("host1", 0, b"\x01" * 32)
    assert addresses == {"lo": [("127.0.0.1", 4242)], "eth0": [("10.0.0.2", 4242)]}


@pytest.mark.parametrize("case", ["unsigned", "other key", "other path", "other body", "no job key"])
def test_a_registration_not_signed_for_this_path_and_body_with_the_job_key_is_refused(case: str) -> None:
    signature = {"unsigned": None, "other key": auth.tag(b"x" * 64, PATH, GOOD),
                 "other path": auth.tag(KEY, "/worker_addresses/host2:0", GOOD),
                 "other body": auth.tag(KEY, PATH, GOOD + b"=")}.get(case, auth.tag(KEY, PATH, GOOD))
    with pytest.raises(auth.Refused):
        auth.registration(None if case == "no job key" else KEY, PATH, GOOD, signature)


@pytest.mark.parametrize("value", [Boom(), (Boom(), b"k"), ({"lo": [Boom()]}, b"k"), ({"lo": [("a", 1)]}, "str"),
                                   [{"lo": []}, b"k"], ({"lo": [("a", "port")]}, b"k"), 42])
def test_even_a_key_holder_cannot_make_the_decoder_run_code_or_accept_another_shape(
        value: object, capsys: pytest.CaptureFixture[str]) -> None:
    body = body_of(value)
    with pytest.raises(auth.Refused):
        auth.registration(KEY, PATH, body, auth.tag(KEY, PATH, body))
    assert "must never run" not in capsys.readouterr().out


@pytest.mark.parametrize("body", [b"not base64 !!", base64.b64encode(b"\x80\x05garbage"), b""])
def test_garbage_bodies_are_refused(body: bytes) -> None:
    with pytest.raises(auth.Refused):
        auth.registration(KEY, PATH, body, auth.tag(KEY, PATH, body))


@pytest.mark.parametrize("path", ["/worker_addresses/host1", "/worker_addresses/:0", "/worker_addresses/h:x",
                                  "/global/0"])
def test_a_signed_body_on_a_path_that_is_not_a_registration_is_refused(path: str) -> None:
    with pytest.raises(auth.Refused):
        auth.registration(KEY, path, GOOD, auth.tag(KEY, path, GOOD))


@pytest.mark.parametrize("header", [None, "", "-1", "1e9", str(auth.MAX_BODY + 1), str(2 ** 40)])
def test_a_body_too_large_or_of_no_stated_length_is_refused_before_reading(header: str | None) -> None:
    with pytest.raises(auth.Refused):
        auth.body_length(header)
    assert auth.body_length(str(auth.MAX_BODY)) == auth.MAX_BODY


def test_the_installed_horovod_signs_and_sends_the_token_exactly_as_the_server_checks(monkeypatch, tmp_path) -> None:
    """The worker half lives in Horovod (patches 0001-0002): the installed build must carry it, with the same tags,
    and find the key in a secrets file as the launcher writes it."""
    from horovod.common import rendezvous_auth as worker

    assert worker.registration_tag(KEY, PATH, GOOD) == auth.tag(KEY, PATH, GOOD)
    assert worker.rendezvous_token(KEY) == auth.token(KEY)
    assert (worker.AUTH_HEADER, worker.TOKEN_HEADER) == (auth.AUTH_HEADER, auth.TOKEN_HEADER)
    secrets = tmp_path / "secrets.env"
    secrets.write_text(f"# a comment\nHF_TOKEN=x\nHVDTRAIN_CONTROL_KEY={KEY.decode()}\n")
    monkeypatch.delenv("HVDTRAIN_CONTROL_KEY", raising=False)
    monkeypatch.setenv("HVDTRAIN_SECRETS_FILE", str(secrets))
    worker.set_token_env()
    assert os.environ[worker.TOKEN_ENV] == auth.token(KEY)
    monkeypatch.delenv("HVDTRAIN_SECRETS_FILE")
    worker.set_token_env()
    assert worker.TOKEN_ENV not in os.environ
    assert "http_store.cc" in PATCH_2.read_text()


def test_paths_are_shown_on_one_line_without_escape_sequences() -> None:
    shown = auth.safe_text("/worker_addresses/\x1b]0;owned\x07\x1b[2J\n" + "x" * 500)
    assert not re.search(r"[\x00-\x1f\x7f]", shown)
    assert shown.endswith("...") and len(shown) < 200


def test_refused_requests_say_one_line_then_a_count(capsys: pytest.CaptureFixture[str]) -> None:
    refused = auth.RefusedRequests("the rendezvous")
    for n in range(3):
        refused(f"PUT /x/{n}")
    refused.summary()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "PUT /x/0" in err[0] and "refused 3 request(s)" in err[1]


# ---------------------------------------------------------------- Horovod's handler behind the checks, on a socket


def http(port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         length: str | None = None) -> int:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        lines = [f"{method} {path} HTTP/1.1", "Host: x", *(f"{k}: {v}" for k, v in (headers or {}).items())]
        if body is not None or length is not None:
            lines.append(f"Content-Length: {length if length is not None else len(body or b'')}")
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))
        return int(sock.recv(64).split(b" ", 2)[1])
    finally:
        sock.close()


@pytest.fixture
def rendezvous():
    from hvdtrain.distributed import horovod_rendezvous

    refused: list[str] = []
    driver, server, port = horovod_rendezvous.elastic_driver(lambda: {"host1": 1}, 1, 1, timeout=30,
                                                         cooldown_range=(600, 600), key=KEY, host="127.0.0.1",
                                                         refused=refused.append)
    registered: list[tuple[str, int]] = []
    driver.register_worker_server = lambda host, slot, addresses, key: registered.append((host, slot))
    yield port, registered, refused, server
    driver.stop()
    server.stop()


def test_the_guarded_rendezvous_listens_only_where_asked_and_refuses_strangers_before_decoding(rendezvous, tmp_path):
    port, registered, refused, server = rendezvous
    assert server._httpd.server_address[0] == "127.0.0.1"
    marker = tmp_path / "unpickled"
    planted = base64.b64encode(pickle.dumps((Planted(marker), b"k")))
    with_token = {auth.TOKEN_HEADER: auth.token(KEY)}
    assert http(port, "PUT", PATH, planted) == 403                                      # no token
    assert http(port, "PUT", PATH, planted, {auth.TOKEN_HEADER: auth.token(b"x" * 64)}) == 403
    assert http(port, "PUT", PATH, planted, with_token) == 403                          # token, no signature
    signed = {**with_token, auth.AUTH_HEADER: auth.tag(KEY, PATH, planted)}
    assert http(port, "PUT", PATH, planted, signed) == 403            # even a key holder's pickle is not unpickled
    assert http(port, "GET", "/rank_and_size/host1:0") == 403                           # no worker marked ready
    assert http(port, "DELETE", "/global/0") == 403
    assert http(port, "PUT", "/global/0", b"x", length=str(2 ** 40)) == 403             # unread: no token
    assert http(port, "PUT", "/global/0", b"", with_token, length=str(2 ** 40)) == 413  # unread: too large
    assert http(port, "GET", "/a/b/c/d", None, with_token) == 400
    assert not marker.exists() and registered == []
    assert len(refused) == 9 and all("\x1b" not in line for line in refused)
    assert http(port, "PUT", PATH, GOOD, {**with_token, auth.AUTH_HEADER: auth.tag(KEY, PATH, GOOD)}) == 200
    assert registered == [("host1", 0)]
    assert http(port, "PUT", "/global/0", b"10.0.0.1:1234", with_token) == 200          # Gloo's own scopes
    assert http(port, "GET", "/global/0", None, with_token) == 200
