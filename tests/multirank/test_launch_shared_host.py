"""hvdtrain.launch() on a host shared with other, unprivileged users (issue 51, items 2 and 3): another user's file
planted under our secrets-file name in /tmp stops no launch, and that user's parallel multi-GB PUTs to the
launcher's job store are refused unread: the launcher's memory stays bounded and the launch returns its result.

The test (root) creates the other users' processes with setpriv; they run /usr/bin/python3.11, which they can
read, and see hvdtrain through the virtualenv's site-packages."""
from __future__ import annotations

import os
import socket
import subprocess
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

import hvdtrain

ATTACKER, VICTIM = 65534, 65533   # nobody, and an id no one uses: two users who are not this test's
SYSTEM_PYTHON = "/usr/bin/python3.11"
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not Path(SYSTEM_PYTHON).exists(),
                                reason="creates other users' processes: needs root and /usr/bin/python3.11")


def as_user(uid: int, code: str, *args: str, **popen: object) -> subprocess.Popen:
    site = sysconfig.get_paths()["purelib"]
    prelude = f"import site, sys; site.addsitedir({site!r}); sys.path.insert(0, {str(Path.cwd())!r})\n"
    return subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", SYSTEM_PYTHON, "-c",
                             prelude + code, *args], cwd="/", **popen)  # type: ignore[call-overload]


def dead_pid() -> int:
    pid = 4_000_000
    while psutil.pid_exists(pid):
        pid -= 1
    return pid


def _double(x: int, seconds: float) -> int:
    import time

    time.sleep(seconds)   # the attack goes on while the job runs
    return x * 2


def test_a_secrets_file_planted_in_tmp_by_another_user_stops_no_launch():
    """Before: remove_leftovers unlinked any `.hvdtrain-secrets-<host>-<dead pid>-*.env`; another user's file (sticky
    /tmp) raised PermissionError, so every launch() of every other user failed while it was there."""
    planted = Path(tempfile.gettempdir()) / f".hvdtrain-secrets-{socket.gethostname()}-{dead_pid()}-planted.env"
    plant = as_user(ATTACKER, "import sys; open(sys.argv[1], 'w').write('X=1\\n')", str(planted))
    assert plant.wait(timeout=60) == 0 and planted.stat().st_uid == ATTACKER
    try:
        # Another unprivileged user writes its own secrets file there (launch() does, for its key).
        victim = as_user(VICTIM, "import os, sys, tempfile\n"
                                 "from pathlib import Path\n"
                                 "from hvdtrain.environment.secrets_file import write_secrets_file\n"
                                 "path = write_secrets_file({'HF_TOKEN': 'x'}, Path(tempfile.gettempdir()))\n"
                                 "print(oct(path.stat().st_mode & 0o777)); os.unlink(path)",
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = victim.communicate(timeout=120)
        assert victim.returncode == 0 and out.strip().endswith("0o600"), out
        # And launch() itself, as this test's user: it leaves the other user's file alone.
        assert hvdtrain.launch(_double, 21, 0, np=2) == 42
        assert planted.exists() and planted.stat().st_uid == ATTACKER
    finally:
        planted.unlink(missing_ok=True)


FLOOD = """
import socket, sys, threading, time
ports = [int(p) for p in sys.argv[1:]]
done = []

def put(port, path):
    # Declares 4 GiB, then sends as fast as loopback takes it until the store closes the connection.
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(f"PUT {path} HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: {4 * 2**30}\\r\\n\\r\\n".encode())
            chunk = b"A" * 2**20
            sent = 0
            while sent < 4 * 2**30:
                s.sendall(chunk)
                sent += len(chunk)
    except OSError:
        pass
    done.append(port)

threads = [threading.Thread(target=put, args=(port, f"/runfunc_result/{n % 2}")) for port in ports for n in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join(timeout=60)
print(f"flooded {len(done)} of {len(threads)}")
"""


def listening() -> set[int]:
    return {c.laddr.port for c in psutil.Process().net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


def test_another_users_multi_gigabyte_puts_to_the_job_store_are_refused_unread_and_memory_stays_bounded(capfd):
    """Before: the store read Content-Length bytes of any /runfunc_result/ PUT into memory before any check."""
    before = listening()
    me = psutil.Process()
    baseline = me.memory_info().rss
    peak = [baseline]
    stop = threading.Event()
    flooders: list[subprocess.Popen] = []

    def attack() -> None:
        while not stop.is_set():
            ports = listening() - before
            if ports and not flooders:
                flooders.append(as_user(ATTACKER, FLOOD, *map(str, sorted(ports)), stdout=subprocess.PIPE,
                                        text=True))
            peak[0] = max(peak[0], me.memory_info().rss)
            stop.wait(0.05)

    watcher = threading.Thread(target=attack, daemon=True)
    watcher.start()
    try:
        started = time.monotonic()
        assert hvdtrain.launch(_double, 5, 8, np=2) == 10
        took = time.monotonic() - started
    finally:
        stop.set()
        watcher.join(timeout=30)
    assert flooders, "the job store's port was never seen"
    out, _ = flooders[0].communicate(timeout=120)
    assert "flooded" in out
    grew = (peak[0] - baseline) / 2**20
    print(f"\nlauncher RSS grew {grew:.0f} MiB at most under 16 PUTs declaring 4 GiB each; launch took {took:.0f} s")
    assert grew < 256, f"the launcher's memory grew {grew:.0f} MiB under the flood"
    assert "refused" in capfd.readouterr().err
