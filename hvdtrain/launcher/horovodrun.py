"""Start horovodrun as a child process with credentials kept off every command line (`hvdtrain launch`, tune jobs).

horovodrun copies its whole environment onto the workers' command lines under Gloo (see environment/secrets_file.py),
so the environment handed to it holds no credential: those go into a 0600 file whose path alone is
forwarded (HVDTRAIN_SECRETS_FILE), and `python -m hvdtrain` on each worker loads it before anything else.
"""
from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from hvdtrain.environment.credentials import split_env
from hvdtrain.environment.secrets_file import SECRETS_FILE_ENV, write_secrets_file
from hvdtrain.errors import UserError


def horovodrun() -> str:
    """horovodrun beside this Python (a virtualenv's), else on PATH."""
    local = Path(sys.executable).parent / "horovodrun"
    found = str(local) if local.exists() else shutil.which("horovodrun")
    if not found:
        raise UserError("horovodrun not found beside this Python or on PATH; run `make setup` or "
                        "scripts/install-horovod (or use --mode inprocess under your own launcher)")
    return found


def worker_env(environ: Mapping[str, str], secrets_dir: Path) -> tuple[dict[str, str], Path | None, list[str]]:
    """(the environment to start horovodrun with, the secrets file written or None, the names it holds).

    The caller removes the file when the job has ended; until then workers may still be starting.
    """
    public, secrets = split_env(environ)
    if not secrets:
        return public, None, []
    path = write_secrets_file(secrets, secrets_dir)
    return {**public, SECRETS_FILE_ENV: str(path)}, path, sorted(secrets)


def remove_quietly(path: Path | None) -> None:
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
