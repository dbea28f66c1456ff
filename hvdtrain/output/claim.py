"""One run per folder: rank 0 claims its run directory with a lock held for the run's life.

The lock is `flock` on `.hvdtrain.lock` (holding the owner's PID and host, and the job's id): the kernel
drops it when the owner exits, even by kill -9, so a lock left behind is known stale without guessing from PIDs.

An elastic job's rank 0 can move to another process (the first one lost, a survivor renumbered): the new
rank 0 takes the lock over (`Handover`), recognising the job by the id in the file, so the folder stays this
job's for its whole life and a concurrent `--resume auto --name X` is refused; a lock of another job is
never taken over.
"""
from __future__ import annotations

import fcntl
import os
import re
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

from hvdtrain.errors import UserError
from hvdtrain.output.console import console

LOCK = ".hvdtrain.lock"
HANDOVER_POLL_S = 0.2   # a new rank 0 waiting for its job's old rank 0 to let go: the gap another run could use
_JOB = re.compile(r"\bjob ([0-9A-Za-z_-]+)")


def owner_line(job: str = "") -> str:
    """What the lock file says of its holder.

    Example:
        >>> job_of(owner_line("a1b2")), job_of("pid 4242 on elsewhere")
        ('a1b2', '')
    """
    return f"pid {os.getpid()} on {socket.gethostname()}" + (f", job {job}" if job else "")


def job_of(owner: str) -> str:
    """The job id in a lock file's text ('' for none: a run of another kind, or an older hvdtrain)."""
    found = _JOB.search(owner)
    return found.group(1) if found else ""


def _make(path: Path) -> tuple[Path, ...]:
    """mkdir -p `path`; the folders it created (deepest first), so a refused run can leave none behind.
    Raises FileExistsError when `path` was there already."""
    missing = tuple(p for p in (path, *path.parents) if not p.exists())
    path.mkdir(parents=True)
    return missing


@dataclass
class Claim:
    """A run folder this process holds: the open, locked file, and the folders the claim made (deepest first),
    so that a run which wrote nothing leaves none behind. `release()` once the run is over (twice is harmless)."""

    path: Path
    fd: int
    made: tuple[Path, ...] = ()

    def release(self) -> None:
        if self.fd < 0:
            return
        lock = self.path / LOCK
        if _same_file(self.fd, lock):
            lock.unlink(missing_ok=True)  # before unlocking: a waiter then sees the file gone and retries
        os.close(self.fd)
        self.fd = -1
        for created in self.made:  # a run refused before it wrote anything leaves no empty folder (nor runs/)
            try:
                created.rmdir()
            except OSError:
                break             # it holds the run's files (or another run's)


def claim(folder: str | Path, *, fresh: bool, job: str = "") -> Claim:
    """Lock `folder` for this process, or raise a one-line UserError naming the run that holds it.

    Args:
        fresh: the folder is for a new run, so one that already holds files (another run's) is refused;
            False for a resume, which continues the run found there.
        job: this run's id, written in the lock file, by which a later rank 0 of an elastic job knows it.
    Returns:
        The held lock; its `release()` gives the folder back.
    """
    path = Path(folder)
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
            mine = f"pid {os.getpid()} on {socket.gethostname()}" in owner
            raise UserError(f"run directory {path} is in use by another run ({owner}); " + (
                "close() the earlier Trainer of this process (or use `with Trainer(...)`), or pass a new --name"
                if mine else "pass a new --name, or wait for that run to end")) from None
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
    _write_owner(fd, job)
    return Claim(path, fd, made)


def _write_owner(fd: int, job: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, owner_line(job).encode(), 0)


def claim_new(parent: str | Path, stem: str, job: str = "") -> Claim:
    """A new folder PARENT/STEM (or STEM-2, STEM-3...), created here so no other run gets the same name."""
    suffix = 1
    while True:
        path = Path(parent) / (stem if suffix == 1 else f"{stem}-{suffix}")
        try:
            made = _make(path)
        except FileExistsError:
            suffix += 1  # two runs in the same second, e.g. fit twice in a notebook
            continue
        held = claim(path, fresh=True, job=job)
        held.made = made
        return held


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


class Handover:
    """The lock of an elastic job's run folder, for the process that is rank 0 now (see the module's doc).

    `take()` once, on a new rank 0 that holds no claim of its own (output/run_directory.py decides): when
    the lock is free and names this job (its holder gone), it is this
    process's at once; when a live process of this job still holds it (the old rank 0, lost but not yet ended,
    or still in the job under another rank), a thread takes it the moment it is let go. A lock that names
    another job, held or left, raises a one-line UserError: another run has used the folder meanwhile.

    Example:
        >>> hand = Handover(run_path, verdict.job)   # doctest: +SKIP
        >>> hand.take(); ...; hand.release()           # doctest: +SKIP
    """

    def __init__(self, folder: str | Path, job: str) -> None:
        self.path, self.job = Path(folder), job
        self.token: Claim | None = None
        self.done = threading.Event()
        self.thread: threading.Thread | None = None
        self.lost_to: str | None = None   # set when another run took the folder while this job waited for it

    def take(self) -> None:
        if self.token is not None:
            return
        if not self._try():
            self.thread = threading.Thread(target=self._wait, name="hvdtrain-run-dir-handover", daemon=True)
            self.thread.start()

    def _try(self) -> bool:
        """One attempt: True when this process holds the lock now, False while this job's old holder does."""
        lock = self.path / LOCK
        while True:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            owner = os.pread(fd, 200, 0).decode(errors="replace").strip()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                owner = owner or "another process"
                if job_of(owner) != self.job:
                    raise UserError(f"run directory {self.path} is in use by another run ({owner}) since this "
                                    "elastic job's rank 0 changed; the job stops (its checkpoints are there: "
                                    "--resume auto continues it once that run ends)") from None
                return False
            if _same_file(fd, lock):
                break
            os.close(fd)   # the holder unlinked it as it let go: a lock on that file claims nothing
        owner = os.pread(fd, 200, 0).decode(errors="replace").strip()
        if owner and job_of(owner) != self.job:
            os.close(fd)   # left by another run that used the folder while this job's rank 0 changed
            raise UserError(f"run directory {self.path} was used by another run ({owner}) while this elastic "
                            "job's rank 0 changed; the job stops rather than mix the two runs' files")
        _write_owner(fd, self.job)
        self.token = Claim(self.path, fd)
        console.line(f"hvdtrain: note: rank 0 moved to this process (pid {os.getpid()} on {socket.gethostname()}); "
                     f"it holds {self.path} for the job now")
        return True

    def _wait(self) -> None:
        while not self.done.wait(HANDOVER_POLL_S):
            try:
                if self._try():
                    return
            except UserError as err:   # too late to stop the job cleanly from here: say so once
                self.lost_to = str(err)
                console.error(f"error: {err}")
                return

    def release(self) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        if self.token is not None:
            self.token.release()
            self.token = None
