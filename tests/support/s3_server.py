"""A real S3 server on loopback for the object-store tests: moto's standalone server (`moto_server`), run from the
virtualenv `make setup` gives it inside the project's ($VENV/moto-server, scripts/setup-env), so that moto's pins
never meet the project's. The store under test talks to it through pyarrow's own S3FileSystem, as it would to S3."""
from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from .paths import BIN
from .ports import free_port
from .waiting import wait_for

SERVER = BIN.parent / "moto-server" / "bin" / "moto_server"



def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True        # an S3 error document is an answer
    except OSError:
        return False


@contextmanager
def running_s3_server(log: Path, server: Path = SERVER) -> Iterator[str]:
    """Start moto_server on 127.0.0.1 at a free port, wait until it answers, yield its endpoint ("127.0.0.1:PORT");
    it is stopped (by its PID) on the way out. No server installed is a test failure naming the fix, not a skip: the
    object-store path is part of the default run."""
    if not server.exists():
        pytest.fail(f"no S3 server at {server}: run make setup (it installs moto's server in a virtualenv of its own)",
                    pytrace=False)
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_for(lambda: proc.poll() is not None or _answers(url), 60, f"moto_server to answer at {url}")
        assert proc.poll() is None, f"moto_server exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
