"""launcher/rendezvous_auth.py: what the elastic rendezvous accepts, and the worker half (Horovod patch 0001)."""
from __future__ import annotations

import base64
import pickle
import re
from pathlib import Path

import pytest

from hvdtrain.launcher import rendezvous_auth as auth

KEY = b"0123456789abcdef" * 4
PATH = "/worker_addresses/host1:0"
PATCH = Path(__file__).resolve().parents[2] / "scripts/horovod/patches/0001-elastic-worker-signs-its-rendezvous-registration.patch"


def body_of(value: object) -> bytes:
    return base64.b64encode(pickle.dumps(value))


GOOD = body_of(({"lo": [("127.0.0.1", 4242)], "eth0": [("10.0.0.2", 4242)]}, b"\x01" * 32))


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
def test_even_a_key_holder_cannot_make_the_decoder_run_code_or_accept_another_shape(value: object,
                                                                                  capsys: pytest.CaptureFixture[str]) -> None:
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


def test_the_installed_horovod_worker_signs_exactly_as_the_server_checks() -> None:
    """The worker half lives in Horovod (patch 0001): the installed build must carry it, with the same tag."""
    from horovod.runner.elastic import worker

    assert worker.rendezvous_tag(KEY, PATH, GOOD) == auth.tag(KEY, PATH, GOOD)
    assert worker.RENDEZVOUS_AUTH_HEADER == auth.AUTH_HEADER
    assert worker.RENDEZVOUS_KEY_ENV == "HVDTRAIN_CONTROL_KEY"
    assert "worker signs" in PATCH.read_text()


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
