"""One run per folder: rank 0 claims its run directory with a lock held for the run's life.

The lock is `flock` on `.hvdtrain.lock` (holding the owner's PID and host): the kernel drops it when
the owner exits, even by kill -9, so a lock left behind is known stale without guessing from PIDs.
"""
from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

from hvdtrain.errors import UserError
from hvdtrain.output.console import console

LOCK = ".hvdtrain.lock"
# folder -> (the open, locked file, the folders this claim made, deepest first); one training per process at a time
_held: dict[str, tuple[int, tuple[Path, ...]]] = {}


def _make(path: Path) -> tuple[Path, ...]:
    """mkdir -p `path`; the folders it created (deepest first), so a refused run can leave none behind.
    Raises FileExistsError when `path` was there already."""
    missing = tuple(p for p in (path, *path.parents) if not p.exists())
    path.mkdir(parents=True)
    return missing


def claim(folder: str | Path, *, fresh: bool) -> int:
    """Lock `folder` for this process, or raise a one-line UserError naming the run that holds it.

    Args:
        fresh: the folder is for a new run, so one that already holds files (another run's) is refused;
            False for a resume, which continues the run found there.
    Returns:
        The lock's token, for `release`.
    """
    path = Path(folder)
    earlier = _held.get(str(path))
    if earlier:
        release(path, earlier[0])  # this process's earlier run there (fit twice in a notebook) is over
    try:
        made = _make(path)
    except FileExistsError:
        made = ()
    lock = path / LOCK
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise UserError(f"run directory {path} is in use by another run ({owner}); pass a new --name, "
                            "or wait for that run to end") from None
        # The owner unlinks the file as it releases: a lock on an unlinked file claims nothing, so retry.
        if _same_file(fd, lock):
            break
        os.close(fd)
    left = os.pread(fd, 200, 0).decode(errors="replace").strip()
    others = [p.name for p in path.iterdir() if p.name != LOCK]
    if fresh and others:
        if not left:
            lock.unlink()  # the empty lock file was ours; a dead run's stays as it was
        os.close(fd)
        raise UserError(f"run directory {path} already holds a run; pass a new --name, or --resume auto to "
                        "continue it")
    if left:
        console.line(f"hvdtrain: note: {path} was locked by a run that is gone ({left}); taking it over")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
    _held[str(path)] = (fd, made)
    return fd


def claim_new(parent: str | Path, stem: str) -> tuple[Path, int]:
    """A new folder PARENT/STEM (or STEM-2, STEM-3...), created here so no other run gets the same name."""
    suffix = 1
    while True:
        path = Path(parent) / (stem if suffix == 1 else f"{stem}-{suffix}")
        try:
            made = _make(path)
        except FileExistsError:
            suffix += 1  # two runs in the same second, e.g. fit twice in a notebook
            continue
        token = claim(path, fresh=True)
        _held[str(path)] = (token, made)
        return path, token


def release(folder: str | Path, token: int | None) -> None:
    """Remove the lock `token` on `folder` if this process still holds it (called when the run's Trainer
    goes; a later run of this process that took the folder over keeps its own)."""
    held = _held.get(str(Path(folder)))
    if token is None or held is None or held[0] != token:
        return
    fd, made = _held.pop(str(Path(folder)))
    lock = Path(folder) / LOCK
    if _same_file(fd, lock):
        lock.unlink(missing_ok=True)  # before unlocking: a waiter then sees the file gone and retries
    os.close(fd)
    for created in made:      # a run refused before it wrote anything leaves no empty folder (nor runs/)
        try:
            created.rmdir()
        except OSError:
            break             # it holds the run's files (or another run's)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False
