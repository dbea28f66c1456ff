"""hvdtrain.launch() attacked on real sockets while it runs: a client that reaches the launcher's listening ports
reads no credential and no usable job, and a forged PUT of a malicious pickle is refused and never unpickled;
the launch still returns the right result. (Issue 36, item 3.)"""
from __future__ import annotations

import base64
import http.client
import pickle
import secrets
import threading
from pathlib import Path

import cloudpickle
import psutil

import hvdtrain
from hvdtrain.launcher.sealed import SealedJob

GET_PATHS = ["/runfunc/func", "/runfunc_result/0", "/runfunc_result/1", "/global/0", "/global/1",
             "/local_localhost/0", "/cross_0/0", "/runfunc/", "/runfunc/func/../../etc/passwd"]
PUT_PATHS = ["/runfunc/func", "/runfunc_result/0", "/runfunc_result/1"]


class Planted:
    """Unpickling this creates a file: the proof that a worker or the launcher unpickled the attacker's bytes."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def _slow_double(x, seconds):
    import os
    import time

    time.sleep(seconds)   # the attack goes on while the job runs
    return x * 2, os.environ.get("HVDTRAIN_TEST_SECRET_TOKEN")


def listening() -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN}


def ask(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=body)
        answer = conn.getresponse()
        return answer.status, answer.read()
    except OSError:
        return 0, b""
    finally:
        conn.close()


class Attacker(threading.Thread):
    """GETs every path it knows and PUTs a planted pickle on every new listening port of this process, in a loop."""

    def __init__(self, before: set[tuple[str, int]], marker: Path) -> None:
        super().__init__(daemon=True)
        self.before = before
        self.planted = base64.b64encode(cloudpickle.dumps(Planted(str(marker)), protocol=pickle.HIGHEST_PROTOCOL))
        self.stop = threading.Event()
        self.got: list[tuple[tuple[str, int], str, int, bytes]] = []
        self.put: list[tuple[tuple[str, int], str, int]] = []

    def run(self) -> None:
        while not self.stop.is_set():
            for where in listening() - self.before:
                for path in GET_PATHS:
                    status, body = ask(where[1], "GET", path)
                    self.got.append((where, path, status, body))
                for path in PUT_PATHS:
                    self.put.append((where, path, ask(where[1], "PUT", path, self.planted)[0]))
            self.stop.wait(0.05)


def readable(body: bytes) -> bytes:
    """A body as sent and, where it is base64 (Horovod's codec), decoded too."""
    try:
        return body + base64.b64decode(body, validate=True)
    except ValueError:
        return body


def test_a_client_on_the_launchers_ports_reads_no_secret_and_cannot_plant_a_pickle(tmp_path, monkeypatch, capfd):
    token = f"hvdt-{secrets.token_hex(16)}"
    argument = f"arg-{secrets.token_hex(8)}"
    monkeypatch.setenv("HVDTRAIN_TEST_SECRET_TOKEN", token)
    marker = tmp_path / "unpickled"
    attacker = Attacker(listening(), marker)
    attacker.start()
    try:
        results = hvdtrain.launch(_slow_double, argument, 3, np=2, all_ranks=True)
    finally:
        attacker.stop.set()
        attacker.join(timeout=30)
    assert results == [(argument * 2, token), (argument * 2, token)]
    assert not marker.exists(), "an attacker's pickle was unpickled"

    # The job store (the port serving the job) and Gloo's rendezvous were found and attacked: every port refused
    # every forged PUT (the rendezvous too: no token of the job's key; issue 51), and they listen on loopback only.
    store = {where for where, path, status, _ in attacker.got if path == "/runfunc/func" and status == 200}
    assert len(store) == 1, attacker.got
    refusing = {where for where, path, status in attacker.put if status == 403}
    assert store < refusing and all(where[0] == "127.0.0.1" for where in refusing), attacker.put
    assert {status for _, _, status in attacker.put} <= {403, 0}   # 0: closed at the end
    # Whatever any port served holds neither the credential nor the job's argument, plain or base64-decoded.
    assert attacker.got
    for where, path, status, body in attacker.got:
        seen = readable(body)
        assert token.encode() not in seen and argument.encode() not in seen, (where, path, status)
    # The one thing the store serves is a file path and ciphertext.
    jobs = [body for where, path, status, body in attacker.got if where in store and status == 200]
    assert jobs and {path for where, path, status, _ in attacker.got if where in store and status == 200} == {
        "/runfunc/func"}
    job = cloudpickle.loads(base64.b64decode(jobs[0]))
    assert isinstance(job, SealedJob) and set(vars(job)) == {"key_file", "job"}
    assert not Path(job.key_file).exists(), "the key file outlived the launch"
    assert "refused" in capfd.readouterr().err
