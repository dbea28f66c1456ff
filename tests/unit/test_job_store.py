"""launch()'s job store on a real socket, without Horovod: what it serves, what it refuses, and that a refused
body is never unpickled. (Issue 36, item 3.)"""
from __future__ import annotations

import base64
import http.client
import pickle
import socket
import stat
import time
from pathlib import Path

import cloudpickle
import pytest

from hvdtrain.environment.secrets_file import write_secrets_file
from hvdtrain.errors import LaunchError
from hvdtrain.launcher import job_store
from hvdtrain.launcher.job_store import JOB_PATH, JobStore, bytes_of_pickle
from hvdtrain.launcher.local import codec_body
from hvdtrain.launcher.sealed import (
    KEY_VAR,
    RESULT_AUTH_HEADER,
    Forged,
    SealedJob,
    new_key,
    read_key,
    result_purpose,
    result_token,
    seal,
    unseal,
)


class Planted:
    """Unpickling this creates a file: the proof that someone unpickled an attacker's bytes."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def request(port: int, method: str, path: str, body: bytes | None = None,
            key: bytes | None = None) -> tuple[int, bytes]:
    """One request; with `key`, a result PUT carries the worker's token for its rank and length, as workers do."""
    headers = {}
    if key is not None and body is not None:
        headers[RESULT_AUTH_HEADER] = result_token(key, int(path.rsplit("/", 1)[1]), len(body))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers)
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def as_worker_puts(value: object) -> bytes:
    """What horovod.runner.run_task PUTs: base64 of the value's pickle (horovod's codec.dumps_base64)."""
    return base64.b64encode(cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


@pytest.fixture
def store():
    key = new_key()
    job = SealedJob("/nonexistent/key-file", seal(key, "job", cloudpickle.dumps("the job")))
    running = JobStore(codec_body(job), key, num_proc=2, host="127.0.0.1")
    port = running.start_server()
    yield running, port, key
    running.shutdown_server()


def test_the_store_serves_only_the_sealed_job_and_listens_on_the_address_given(store):
    running, port, key = store
    assert running.httpd is not None and running.httpd.server_address[0] == "127.0.0.1"
    status, body = request(port, "GET", JOB_PATH)
    job = cloudpickle.loads(base64.b64decode(body))
    assert status == 200 and isinstance(job, SealedJob)
    assert b"the job" not in job.job and unseal(key, "job", job.job) == cloudpickle.dumps("the job")
    for path in ("/runfunc_result/0", "/global/0", "/", "/../../etc/passwd", "/runfunc/func/x"):
        assert request(port, "GET", path)[0] == 404, path
    assert request(port, "HEAD", "/")[0] == 501   # http.server's file serving is not reachable either


def test_forged_puts_are_refused_and_never_unpickled(store, tmp_path):
    running, port, key = store
    marker = tmp_path / "unpickled"
    planted = as_worker_puts(Planted(marker))
    for path in (JOB_PATH, "/runfunc_result/0", "/runfunc_result/1", "/runfunc_result/7", "/global/0"):
        assert request(port, "PUT", path, planted)[0] == 403, path
    # bytes, but sealed with another key, or for another rank, or not base64 at all: refused even with a token
    other = seal(new_key(), result_purpose(0), cloudpickle.dumps(Planted(marker)))
    assert request(port, "PUT", "/runfunc_result/0", as_worker_puts(other), key)[0] == 403
    wrong_rank = seal(key, result_purpose(1), cloudpickle.dumps(Planted(marker)))
    assert request(port, "PUT", "/runfunc_result/0", as_worker_puts(wrong_rank), key)[0] == 403
    assert request(port, "PUT", "/runfunc_result/0", b"%%% not base64", key)[0] == 403
    assert not marker.exists() and running.results == {}
    assert request(port, "GET", JOB_PATH)[0] == 200   # the job is still the launcher's
    assert len(running.refused) == 8


def test_a_sealed_result_is_taken_once_and_read_in_process(store):
    running, port, key = store
    sealed = seal(key, result_purpose(1), cloudpickle.dumps({"acc": 0.9}))
    assert request(port, "PUT", "/runfunc_result/1", as_worker_puts(sealed))[0] == 403   # no token: unread
    assert request(port, "PUT", "/runfunc_result/1", as_worker_puts(sealed), key)[0] == 200
    assert request(port, "PUT", "/runfunc_result/1", as_worker_puts(sealed), key)[0] == 403   # no second one
    assert running.result(1) == {"acc": 0.9}
    assert request(port, "GET", "/runfunc_result/1")[0] == 404   # results are never served
    with pytest.raises(RuntimeError, match="rank 0 sent no result"):
        running.result(0)


def test_bytes_of_pickle_reads_opcodes_and_refuses_anything_that_is_not_one_bytes_object(tmp_path):
    for size in (0, 10, 300, 70_000):
        data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        for protocol in (3, 4, 5):
            assert bytes_of_pickle(cloudpickle.dumps(data, protocol=protocol)) == data
    marker = tmp_path / "unpickled"
    for value in (Planted(marker), "text", [b"a"], (b"a", b"b")):
        with pytest.raises(ValueError):
            bytes_of_pickle(cloudpickle.dumps(value))
    with pytest.raises(ValueError):
        bytes_of_pickle(cloudpickle.dumps(b"abc")[:-3])
    assert not marker.exists()


def test_seal_binds_key_and_purpose(tmp_path):
    key = new_key()
    sealed = seal(key, result_purpose(0), b"value")
    assert unseal(key, result_purpose(0), sealed) == b"value"
    for wrong_key, purpose, data in [(new_key(), result_purpose(0), sealed), (key, result_purpose(1), sealed),
                                     (key, "job", sealed), (key, result_purpose(0), sealed[:-1] + b"\0"),
                                     (key, result_purpose(0), b"short")]:
        with pytest.raises(Forged):
            unseal(wrong_key, purpose, data)


def test_the_key_file_is_private_and_read_back(tmp_path):
    key = new_key()
    path = write_secrets_file({KEY_VAR: key.hex()}, tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_key(str(path)) == key


def send_head(port: int, path: str, length: int, token: str | None = None) -> socket.socket:
    """A PUT's request line and headers, declaring `length` bytes, and no body (yet)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    extra = f"{RESULT_AUTH_HEADER}: {token}\r\n" if token else ""
    sock.sendall(f"PUT {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n{extra}\r\n".encode())
    return sock


def status_of(sock: socket.socket) -> int:
    return int(sock.recv(64).split(b" ", 2)[1])


def test_a_put_declaring_gigabytes_or_without_the_workers_token_is_answered_at_once_unread(store):
    """Issue 51: the store read Content-Length bytes of any /runfunc_result/ PUT into memory before checking it."""
    running, port, key = store
    for path, length, token in (("/runfunc_result/0", 8 * 2**30, result_token(key, 0, 8 * 2**30)),
                                ("/runfunc_result/0", 1000, None), ("/runfunc_result/0", 1000, "0" * 64),
                                ("/runfunc_result/9", 1000, result_token(key, 9, 1000))):
        sock = send_head(port, path, length, token)
        started = time.monotonic()
        assert status_of(sock) == 403 and time.monotonic() - started < 5   # no body was awaited
        sock.close()
    assert running.inflight == 0 and running.results == {}


def test_slow_bodies_of_a_key_holder_hold_at_most_the_budget_and_are_cut_off(monkeypatch):
    """Bodies in flight together stay under INFLIGHT_FACTOR x the largest result; a trickled one is cut off."""
    monkeypatch.setattr(job_store, "BODY_DEADLINE_S", 1.0)
    monkeypatch.setattr(job_store, "REQUEST_TIMEOUT_S", 1)
    monkeypatch.setattr(job_store._Handler, "timeout", 1)
    key = new_key()
    running = JobStore(b"job", key, num_proc=4, host="127.0.0.1", max_result=2**20)
    port = running.start_server()
    try:
        socks = [send_head(port, f"/runfunc_result/{rank}", 2**20, result_token(key, rank, 2**20))
                 for rank in range(4)]
        for sock in socks:
            sock.sendall(b"x")   # a byte now and then: the body never completes
        time.sleep(0.5)
        assert running.inflight <= job_store.INFLIGHT_FACTOR * 2**20
        assert sorted(status_of(sock) for sock in socks) == [403] * 4   # cut off, or no room: all refused
        assert running.inflight == 0 and running.results == {}
        sealed = seal(key, result_purpose(2), cloudpickle.dumps("rank 2's"))
        assert request(port, "PUT", "/runfunc_result/2", as_worker_puts(sealed), key)[0] == 200   # still taken
        assert running.result(2) == "rank 2's"
    finally:
        running.shutdown_server()


def test_the_largest_result_comes_from_the_environment_with_a_clear_error_for_a_bad_value():
    assert job_store.max_result_bytes({job_store.MAX_RESULT_ENV: "512"}) == 512 * 2**20
    with pytest.raises(LaunchError, match="HVDTRAIN_LAUNCH_MAX_RESULT_MB='lots'"):
        job_store.max_result_bytes({job_store.MAX_RESULT_ENV: "lots"})
