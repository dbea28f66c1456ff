"""A real `mlflow server` on loopback (sqlite backend), started by the tests and killed by PID.

MLflow 3's server also starts a job runner with seven huey consumers by default (GenAI jobs; nothing a tracked run
uses), each a process importing MLflow: tens of seconds of CPU more per start. It is off here
(MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false). Even so a start costs seconds of CPU (MLflow's imports, the store's
migrations, a uvicorn worker), so the tests that only log to a server share one per pytest process
(`shared_mlflow_server`, each in its own experiment or by run id); a test that kills its server starts its own
(`started_mlflow_server`).
"""
from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from .paths import BIN
from .ports import free_port
from .processes import kill_tree


@contextmanager
def started_mlflow_server(folder: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """(http://127.0.0.1:PORT, its process) of a fresh server keeping its store and log in `folder`; it and its
    workers are killed by PID at the end."""
    port = free_port()
    log = (folder / "server.log").open("w")
    proc = subprocess.Popen([str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1", "--backend-store-uri", f"sqlite:///{folder / 'server.db'}",
                             "--artifacts-destination", str(folder / "server-artifacts")],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=folder,
                            env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180   # a happy-path bound: on a loaded machine a start has taken 2 min
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (folder / "server.log").read_text()
            time.sleep(0.2)
        yield url, proc
    finally:
        if proc.poll() is None:
            kill_tree(proc, 9)
        log.close()


_SHARED: dict[str, tuple[str, subprocess.Popen]] = {}


@pytest.fixture(scope="session")
def shared_mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen]]:
    """One server for every test of this pytest process that imports this fixture and does not kill it: tests
    keep apart by experiment name or run id. Imported into several test files, it is one fixture per file that
    starts the server once (the first to run) and kills it at the session's end."""
    if "server" not in _SHARED or _SHARED["server"][1].poll() is not None:
        with started_mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as server:
            _SHARED["server"] = server
            yield server
        _SHARED.pop("server", None)
    else:
        yield _SHARED["server"]
