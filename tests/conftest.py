"""Shared fixtures: environment isolation and a real horovodrun launcher for multi-rank tests."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@pytest.fixture(autouse=True)
def restore_environ():
    """Tests may set variables; none leaks into the next test."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def horovodrun(np: int, args: list[str], backend: str, timeout: int = 300,
               cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `horovodrun -np N -H localhost:N --gloo|--mpi python ARGS` for real."""
    horovodrun_bin = BIN / "horovodrun"
    cmd = [str(horovodrun_bin), "-np", str(np), "-H", f"localhost:{np}", f"--{backend}",
           "--start-timeout", "120", "--disable-cache", "--network-interfaces", "lo"]
    cmd += [sys.executable, *args]
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.run(cmd, cwd=cwd or ROOT, env=full_env, capture_output=True, text=True,
                          timeout=timeout)
    return proc


def show(proc: subprocess.CompletedProcess) -> str:
    """Every rank's output, for assertion messages."""
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"


BACKENDS = pytest.mark.parametrize("backend", ["gloo", "mpi"])
