"""Whole files or none: every file hvdtrain writes goes through `atomic_write`."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from hvdtrain.errors import UserError

# The temp file is always a new file of ours: O_EXCL fails on anything already at its name, a symlink included
# (never followed, even dangling), and O_NOFOLLOW says so twice. Someone who can write the folder and plants a
# link there between our unlink and our open gets FileExistsError, and we remove the link and try again.
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
_CREATE_TRIES = 3


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object], *, mode: int = 0o666,
                 before_replace: Callable[[], object] | None = None) -> Path:
    """Write `path` through `.NAME.tmp` beside it, fsync, rename, fsync the folder.

    A crash or a full disk leaves the previous file (or none), never half a file. Errors of the
    filesystem become a one-line UserError naming the path; on any error the temporary file is removed.
    The temporary file is created new (O_EXCL | O_NOFOLLOW): a leftover of a crash is removed first, and a
    symlink planted at its name is removed, never written through.

    Args:
        write: called with the open binary temp file, e.g. `lambda f: torch.save(obj, f)`.
        mode: permissions before the process umask takes its bits away, as `open()` does (umask 077 keeps a
            run folder private); 0o600 for a file that holds a credential, whatever the umask.
        before_replace: for fault-injection tests, called between the write and the rename.
    Example:
        >>> atomic_write("runs/x/summary.json", lambda f: f.write(b"{}"))
    """
    final = Path(path)
    tmp = final.with_name(f".{final.name}.tmp")
    try:
        with os.fdopen(_create(tmp, mode), "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, final)
        folder = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(folder)  # the rename itself survives a crash
        finally:
            os.close(folder)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise UserError(f"cannot write {final}: {err.strerror or err}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)  # a writer's own error (or Ctrl-C) leaves no half file behind either
        raise
    return final


def _create(tmp: Path, mode: int) -> int:
    """A new file at `tmp`, opened for writing; whatever was at that name (a crash's leftover with its own
    mode, a planted symlink) is removed, not reused or followed."""
    for _ in range(_CREATE_TRIES - 1):
        tmp.unlink(missing_ok=True)   # unlinks a symlink itself, never its target
        try:
            return os.open(tmp, _CREATE, mode)
        except FileExistsError:
            continue   # planted again between the two calls
    tmp.unlink(missing_ok=True)
    return os.open(tmp, _CREATE, mode)   # a third FileExistsError is the caller's UserError


def write_text(path: str | Path, text: str, *, mode: int = 0o666) -> Path:
    return atomic_write(path, lambda handle: handle.write(text.encode()), mode=mode)
