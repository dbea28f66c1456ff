"""Real processes for the tests: horovodrun on this machine, the whole family of a launcher killed by PID, and a
finished process's output shaped for an assertion message."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .paths import BIN, ROOT

BACKENDS = pytest.mark.parametrize("backend", ["gloo", "mpi"])


def horovodrun_cmd(np: int, args: list[str], backend: str) -> list[str]:
    """`horovodrun -np N -H localhost:N --gloo|--mpi python ARGS`, on loopback, with no cached host check."""
    return [str(BIN / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", f"--{backend}",
            "--start-timeout", "120", "--disable-cache", "--network-interfaces", "lo", sys.executable, *args]


def horovodrun(np: int, args: list[str], backend: str, timeout: int = 300,
               cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `horovodrun -np N -H localhost:N --gloo|--mpi python ARGS` for real."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run(horovodrun_cmd(np, args, backend), cwd=cwd or ROOT, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def kill_tree(proc: subprocess.Popen, sig: int) -> None:
    """Signal horovodrun and every process it started (workers run in their own sessions), by PID."""
    import psutil

    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for member in family:
        try:
            member.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=30)
    proc.wait(timeout=30)


def show(proc: subprocess.CompletedProcess) -> str:
    """Every rank's output, for assertion messages."""
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"


def horovod_patched(variable: str) -> bool:
    """The installed Horovod's extension reads `variable`, i.e. carries the hvdtrain patch that adds it
    (scripts/horovod/patches, 0008 and 0009); False without Horovod."""
    from hvdtrain.distributed import runtime

    if runtime.hvd is None:
        return False
    libs = Path(runtime.hvd.__file__).parent.glob("mpi_lib_v2*.so")
    return any(variable.encode() in lib.read_bytes() for lib in libs)
