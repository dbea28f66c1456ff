"""The secrets file, the one home of its format: `NAME=value` lines (blank lines and # comments skipped, as
`docker run --env-file` reads them) in a 0600 file whose *path* alone travels, as HVDTRAIN_SECRETS_FILE
(SECRETS_FILE_ENV). Written by the launchers (`hvdtrain launch`, `hvdtrain tune`), loaded by every worker before any
user code runs, read for the control key by distributed/control_wire.py.

Why: horovodrun with Gloo starts every worker as `sh -c 'env NAME=value ... python ...'`, and on a
remote host inside `ssh HOST 'cd DIR ; env NAME=value ...'`, so every exported variable's value is in
the process list of the launching host and of every worker host (horovod/runner/gloo_run.py,
`_slot_info_to_command_fn`). With MPI, horovodrun passes `mpirun -x NAME` (names only) and Open MPI
sends the values over its own channel. hvdtrain's launchers therefore take credential-like variables
(environment/credentials.py says which) out of the environment they hand to Horovod and deliver them another way:
inside the pickled job (`launch()`, Spark) or in this file.

Nothing here imports Horovod; the calling process and the workers both use it.
"""
from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path

from hvdtrain.errors import LaunchError, UserError

SECRETS_FILE_ENV = "HVDTRAIN_SECRETS_FILE"
_PREFIX = ".hvdtrain-secrets-"


def write_secrets_file(secrets: Mapping[str, str], folder: Path) -> Path:
    """Write `NAME=value` lines to a new file only its owner can read, in `folder`; returns its path.

    The folder must be visible to the workers at the same path (the run directory's file system).
    """
    for name, value in secrets.items():
        if "\n" in value or "\r" in value:
            raise LaunchError(f"variable {name} holds a line break and cannot go in a secrets file; "
                              "put its value in a file of its own and pass that file's path instead")
    folder.mkdir(parents=True, exist_ok=True)
    remove_leftovers(folder)
    # mkstemp creates the file 0600 from the start: no moment where it is readable by others. The name
    # carries host and PID, so a later launch can tell a killed launcher's file from a live one's.
    handle, path = tempfile.mkstemp(prefix=f"{_PREFIX}{socket.gethostname()}-{os.getpid()}-", suffix=".env",
                                    dir=folder)
    with os.fdopen(handle, "w") as out:
        out.write("".join(f"{name}={value}\n" for name, value in secrets.items()))
    return Path(path)


def remove_leftovers(folder: Path) -> list[Path]:
    """Delete secrets files in `folder` written on this host by launchers no longer running (kill -9 leaves
    them, as no handler runs); returns them. Files of other hosts or of live processes are left alone."""
    removed = []
    for path in folder.glob(f"{_PREFIX}{socket.gethostname()}-*-*.env"):
        pid = path.name[len(_PREFIX) + len(socket.gethostname()) + 1:].split("-", 1)[0]
        try:
            # Another user's file (a shared /tmp, sticky) is theirs to remove: unlinking it would fail, and
            # a file planted under our name pattern must not stop our launch.
            if path.lstat().st_uid != os.getuid() or not pid.isdigit() or _alive(int(pid)):
                continue
            path.unlink()
        except OSError:
            continue   # gone meanwhile, or not ours to remove
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True   # someone else's process
    return True


def read_secrets_file(path: Path) -> dict[str, str]:
    """`NAME=value` per line (blank lines and # comments skipped), as `docker run --env-file` reads them."""
    try:
        text = path.read_text()
    except OSError as err:
        raise UserError(f"{SECRETS_FILE_ENV}={path}: cannot read it on this host ({err.strerror}); the file "
                        "must exist at that path on every worker host") from None
    found = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip().isidentifier():
            raise UserError(f"{SECRETS_FILE_ENV}={path} line {number}: expected NAME=value")
        found[name.strip()] = value
    return found


def load_secrets_file(environ: dict[str, str] | os._Environ[str] = os.environ) -> list[str]:
    """On a worker: set the variables of HVDTRAIN_SECRETS_FILE (if set) in `environ`; returns their names."""
    location = environ.get(SECRETS_FILE_ENV)
    if not location:
        return []
    path = Path(location)
    found = read_secrets_file(path)
    environ.update(found)
    return sorted(found)
