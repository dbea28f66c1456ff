"""The checkpoint file format: files written atomically by rank 0, named by step (and branch), read back with
torch.load(weights_only=True), the newest that loads found among damaged ones.

A checkpoint holds only tensors and plain Python values, so loading one cannot run code. What goes in it is the
manager's (checkpoint/manager.py); the random streams' part is checkpoint/rng_state.py's.
"""
from __future__ import annotations

import errno
import io
import os
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import torch

from hvdtrain.errors import UserError, first_line
from hvdtrain.output.files import atomic_write

# 2: metric sums laid out by train/metrics.MetricSet (1 held [loss, correct, count]).
FORMAT = "hvdtrain-checkpoint-2"
# ckpt-<step>.pt, or ckpt-<step>-b<branch>.pt after a rollback: newer means a later branch, then a higher step.
_NAME = re.compile(r"^ckpt-(\d{9})(?:-b(\d+))?\.pt$")
UNREADABLE = ".unreadable"
# Fault injection for tests: seconds to sleep between writing the temp file and renaming it.
WRITE_DELAY_ENV = "HVDTRAIN_CHECKPOINT_WRITE_DELAY_S"
# Storage that may fail a read and then serve it (NFS, FUSE mounts, a busy host): these are tried again.
TRANSIENT = frozenset({errno.EIO, errno.ESTALE, errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT, errno.EBUSY,
                       errno.ENOLCK, errno.ECONNRESET, errno.ENOMEM})
RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0)   # between tries of a read that failed transiently (7.5 s in all)


class CheckpointReadError(UserError):
    """The storage failed to read a checkpoint (after retries): the file may be whole, so it is left alone."""


class CheckpointVersionError(UserError):
    """A whole checkpoint that this hvdtrain does not read (another format version, or no hvdtrain marker)."""


class _WatchedFile(io.FileIO):
    """A file that keeps the storage's OSError, however torch.load wraps it (its C++ reader may not re-raise it)."""

    error: OSError | None = None

    def readinto(self, buffer: Any) -> int | None:
        try:
            return super().readinto(buffer)
        except OSError as err:
            self.error = err
            raise


def checkpoint_dir(run_path: str | Path) -> Path:
    return Path(run_path) / "checkpoints"


def file_name(step: int, branch: int = 0) -> str:
    return f"ckpt-{step:09d}.pt" if not branch else f"ckpt-{step:09d}-b{branch}.pt"


def save(directory: Path, step: int, payload: dict[str, Any], keep: int) -> Path:
    """Write ckpt-<step>.pt atomically (temp file, fsync, rename), then keep only the newest `keep`.

    The branch (payload["progress"]["branch"], see branch_after) goes into the name, so a rollback's
    checkpoints rank above the abandoned, higher-numbered ones.
    """
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(".ckpt-*.tmp"):  # left by a writer that was killed; only rank 0 writes
        stale.unlink(missing_ok=True)
    final = write(directory / file_name(step, payload.get("progress", {}).get("branch", 0)), payload)
    for old in candidates(directory)[keep:]:
        old.unlink(missing_ok=True)
    return final


def write(final: Path, payload: dict[str, Any]) -> Path:
    """One checkpoint file at `final`, atomically, with the format marker: save()'s files, and hvdtrain.save's
    (a loop of the user's own names its file)."""
    delay = float(os.environ.get(WRITE_DELAY_ENV, "0") or 0)
    return atomic_write(final, lambda handle: torch.save({"format": FORMAT, **payload}, handle),
                        before_replace=(lambda: time.sleep(delay)) if delay else None)


def save_new(directory: Path, step: int, payload: dict[str, Any], keep: int) -> Path | None:
    """As save, but only where no checkpoint of this step exists (then None): for a survivor's one-worker save
    beside rank 0, whose all-worker file of the same step wins (its rename replaces this one; this link never
    replaces it). Several survivors may call it at once: each stages its own file, the first link wins.

    A temp file of rank 0 does not stop it: rank 0 may be the worker that was lost mid-write (its temp file stays),
    or a killed earlier run's; whichever file lands last under the final name is rank 0's."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / file_name(step, payload.get("progress", {}).get("branch", 0))
    if final.exists():
        return None
    # Not through the final name's temp file (rank 0 may start one now) and no sweep of temp files (rank 0's).
    staged = atomic_write(directory / f".survivor-{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}-"
                                      f"{final.name}",
                          lambda handle: torch.save({"format": FORMAT, **payload}, handle))
    try:
        os.link(staged, final)
    except FileExistsError:
        return None
    finally:
        staged.unlink(missing_ok=True)
    for old in candidates(directory)[keep:]:
        old.unlink(missing_ok=True)
    return final


def _order(path: Path) -> tuple[int, int]:
    match = _NAME.match(path.name)
    assert match is not None
    return int(match[2] or 0), int(match[1])


def candidates(directory: Path) -> list[Path]:
    """Checkpoint files, newest first: the latest branch, then the highest step."""
    if not directory.is_dir():
        return []
    return sorted((p for p in directory.iterdir() if _NAME.match(p.name)), key=_order, reverse=True)


def branch_after(directory: Path, branch: int, step: int) -> int:
    """The branch a run resumed from (branch, step) writes into `directory`: the same one, unless newer
    checkpoints are there (a rollback): then a new branch, so they stay and rank below the new ones."""
    found = [_order(p) for p in candidates(directory)]
    if not found or max(found) <= (branch, step):
        return branch
    return max(b for b, _ in found) + 1


def _read(path: Path) -> Any:
    """torch.load of one file, weights_only (loading cannot run code); a storage error comes out as OSError."""
    raw = _WatchedFile(path)
    try:
        with io.BufferedReader(raw) as handle:
            return torch.load(handle, map_location="cpu", weights_only=True)
    except Exception:
        if raw.error is not None:
            raise raw.error from None
        raise


def _torch_load(path: Path, what: str) -> Any:
    """The one reader of files hvdtrain wrote, with one-line errors.

    Raises:
        UserError: the file is missing, or its bytes are not a torch file (truncated, corrupt, not ours).
        CheckpointReadError: the storage failed to read it, also after RETRY_DELAYS_S (EIO, ESTALE...,
            MemoryError), or refused it (EACCES...): the file may be whole, and is not a corrupt one.
    """
    for attempt in range(len(RETRY_DELAYS_S) + 1):
        if not path.is_file():
            raise UserError(f"{what} {path} does not exist")
        try:
            return _read(path)
        except FileNotFoundError:
            raise UserError(f"{what} {path} does not exist") from None
        except (OSError, MemoryError) as err:
            transient = isinstance(err, MemoryError) or err.errno in TRANSIENT
            if transient and attempt < len(RETRY_DELAYS_S):
                time.sleep(RETRY_DELAYS_S[attempt])
                continue
            why = f"{type(err).__name__}: {first_line(err, 120)}" if str(err) else type(err).__name__
            tries = f" in {attempt + 1} tries" if attempt else ""
            raise CheckpointReadError(f"cannot read {what} {path}{tries} ({why}); the file is left as it is: "
                                      "check the storage (or free memory) and run again") from None
        except Exception as err:
            raise UserError(f"{path} is not a readable hvdtrain {what} ({first_line(err, 160)})") from None
    raise AssertionError("unreachable")


def _check_format(path: Path, payload: Any) -> None:
    """A whole file that is no checkpoint of this version: one line naming both versions and the way out."""
    found = payload.get("format") if isinstance(payload, dict) else None
    if found == FORMAT:
        return
    if isinstance(found, str) and found.startswith("hvdtrain-checkpoint-") and len(found) <= 40:
        raise CheckpointVersionError(
            f"{path} is checkpoint format {found}, this hvdtrain reads {FORMAT}: resume it with the hvdtrain "
            "version that wrote it, or start a new run (another --name, no --resume); the file is left as it is")
    found = found[:80] if isinstance(found, str) else None  # a tensor or a line break would not fit one line
    why = f"format {found!r}, this hvdtrain reads {FORMAT}" if found else f"no '{FORMAT}' marker"
    raise CheckpointVersionError(f"{path} is not an hvdtrain checkpoint ({why})")


def load(path: Path) -> dict[str, Any]:
    """Read one checkpoint.

    Raises:
        UserError: missing, or not a torch file (truncated or corrupt).
        CheckpointVersionError: a whole file, of another checkpoint format version or not a checkpoint.
        CheckpointReadError: the storage failed to read it (see _torch_load).
    """
    payload = _torch_load(path, "checkpoint")
    _check_format(path, payload)
    return payload


def read_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """Model weights from a checkpoint (with its config) or from a plain state dict such as model.pt.

    Returns:
        (state_dict, the checkpoint's config as a dict, or None for a plain state dict).
    """
    if Path(path).suffix == ".safetensors":      # model.safetensors / best.safetensors: no pickle at all
        from safetensors.torch import load_file

        if not Path(path).is_file():
            raise UserError(f"checkpoint {path} does not exist")
        try:
            return load_file(path), None
        except Exception as err:
            raise UserError(f"{path} is not a readable safetensors file ({first_line(err, 160)})") from None
    payload = _torch_load(path, "checkpoint")  # once: a checkpoint can be as large as the model and optimizer
    if isinstance(payload, dict) and "format" in payload:
        _check_format(path, payload)  # the same words as load()
        if not isinstance(payload.get("model"), dict) or not isinstance(payload.get("config"), dict):
            raise UserError(f"{path} is an hvdtrain checkpoint without a model and its config (a damaged file?)")
        return payload["model"], payload["config"]
    if not (isinstance(payload, dict) and payload and all(isinstance(v, torch.Tensor) for v in payload.values())):
        raise UserError(f"{path} holds neither an hvdtrain checkpoint nor a model's state dict")
    return payload, None


def find_latest(directory: Path) -> tuple[dict[str, Any] | None, Path | None, list[str]]:
    """The newest checkpoint that loads; newer ones whose bytes are damaged (truncated, corrupt) are renamed
    *.unreadable, so they keep no --keep-checkpoints slot and stay for a look. Notes: one line on what was
    moved aside.

    Raises:
        CheckpointVersionError: the newest whole file is of another format version (it is left alone: restarting
            from an older checkpoint, or from step 0, would silently throw its training away).
        CheckpointReadError: the storage failed to read one, also when tried again: never "no checkpoint".
    """
    moved: list[str] = []
    found: tuple[dict[str, Any] | None, Path | None] = (None, None)
    for path in candidates(directory):
        try:
            found = load(path), path
            break
        except (CheckpointVersionError, CheckpointReadError):
            raise
        except UserError as err:
            if not path.exists():       # gone since it was listed (another writer's cleanup): the next one
                continue
            path.rename(path.with_name(path.name + UNREADABLE))
            moved.append(str(err))
    notes = [f"skipping {moved[0]}; moved aside as *{UNREADABLE}"
             + (f" with {len(moved) - 1} more" if len(moved) > 1 else "")] if moved else []
    return found[0], found[1], notes
