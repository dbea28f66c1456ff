"""The job `hvdtrain.launch()` hands to Horovod, sealed: encrypted and authenticated with a per-launch key.

Horovod's Python launcher (`horovod.runner.run`) carries the job to the workers and their results back
through an HTTP key-value store on the launching host, with no authentication. So what goes through it
is sealed with AES-GCM under a key made fresh for each launch: the job (the user's function, its arguments
and the credential variables) as `SealedJob.job`, each rank's result as the bytes `SealedJob()` returns.
Anyone who reaches the store reads ciphertext, and cannot forge what a worker or the launcher accepts.

The key never travels over the network or on a command line: the launcher writes it into a 0600 secrets
file (secrets.write_secrets_file) and only that file's path is in the job; every worker reads it there, so
the file must be at that path on every worker host (the launching host's temp folder for a one-machine
launch; a shared folder, `secrets_dir=`, for several hosts).

Nothing here imports Horovod: the workers unpickle `SealedJob` and call it.
"""
from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from hvdtrain.environment import process
from hvdtrain.errors import LaunchError, UserError

KEY_VAR = "HVDTRAIN_LAUNCH_KEY"   # its line in the secrets file
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
# AES-GCM as `cryptography` implements it takes at most 2**31 - 1 bytes per message.
MAX_SEALED = 2 ** 31 - 1
# Bound into every tag: a job cannot be taken for a result, nor one rank's result for another's.
_CONTEXT = b"hvdtrain.launch/1 "


class Forged(ValueError):
    """Bytes that were not sealed with this launch's key for this purpose."""


def new_key() -> bytes:
    return AESGCM.generate_key(bit_length=8 * KEY_BYTES)


def seal(key: bytes, purpose: str, data: bytes) -> bytes:
    """nonce | AES-GCM(key, data, associated data = purpose). Raises LaunchError above 2 GiB."""
    if len(data) > MAX_SEALED:
        raise LaunchError(f"{purpose}: {len(data)} bytes is more than launch() can carry (2 GiB); "
                          "write large values to files and pass or return their paths")
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, data, _CONTEXT + purpose.encode())


def unseal(key: bytes, purpose: str, sealed: bytes) -> bytes:
    """The data `seal(key, purpose, ...)` sealed; raises Forged for anything else (checked before any use)."""
    if len(sealed) < NONCE_BYTES + TAG_BYTES:
        raise Forged(f"{purpose}: too short to be sealed")
    try:
        return AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], _CONTEXT + purpose.encode())
    except InvalidTag:
        raise Forged(f"{purpose}: not sealed with this launch's key") from None


def result_purpose(rank: int) -> str:
    return f"result of rank {rank}"


RESULT_AUTH_HEADER = "X-Hvdtrain-Result"


def result_token(key: bytes, rank: int, length: int) -> str:
    """What a worker's result PUT carries in RESULT_AUTH_HEADER: proof of the launch's key, bound to the rank and
    the body's length, checked before the body is read (the body itself is sealed: checked after).

    Example:
        >>> result_token(b"k" * 32, 0, 10) == result_token(b"k" * 32, 0, 10) != result_token(b"k" * 32, 1, 10)
        True
    """
    return hmac.new(key, _CONTEXT + f"result PUT {rank} {length}".encode(), hashlib.sha256).hexdigest()


def read_key(key_file: str) -> bytes:
    """The launch's key from its secrets file; a UserError naming the file when this host cannot read it."""
    from hvdtrain.environment.secrets_file import read_secrets_file

    value = read_secrets_file(Path(key_file)).get(KEY_VAR, "")
    try:
        key = bytes.fromhex(value)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise UserError(f"{key_file}: no {KEY_VAR} line of {2 * KEY_BYTES} hex digits")
    return key


@dataclass(frozen=True)
class SealedJob:
    """What Horovod's store holds for the workers: the secrets file's path and the sealed job, nothing else.

    Called on a worker (by horovod.runner.run_task), it reads the key, opens the job, runs it, and returns
    its rank's result sealed: the only thing the launcher's store accepts from a worker.
    """

    key_file: str
    job: bytes

    def __call__(self) -> bytes:
        key = read_key(self.key_file)
        rank, sealed = run_sealed(key, self.job)
        from hvdtrain.distributed import horovod_runner

        horovod_runner.sign_result_put(lambda rank_text, body: {
            RESULT_AUTH_HEADER: result_token(key, int(rank_text) if rank_text.isdigit() else -1, len(body))})
        return sealed


def run_sealed(key: bytes, sealed_job: bytes) -> tuple[int, bytes]:
    """On a worker: open the sealed job (authenticated before anything is unpickled), run it, and return this rank
    and its result sealed. UserError for a job that is not this launch's."""
    try:
        guarded = cloudpickle.loads(unseal(key, "job", sealed_job))
    except Forged as err:
        raise UserError(f"launch(): the job is not this launch's ({err}); refusing to run it") from None
    value = guarded()
    rank = process.current().rank
    return rank, seal(key, result_purpose(rank), dumps_result(value, rank))


def dumps_result(value: Any, rank: int) -> bytes:
    """A rank's return value, pickled; one that cannot be comes back as that rank's failure."""
    try:
        return cloudpickle.dumps(value)
    except Exception as err:   # an unpicklable return value comes back as that rank's failure
        import socket

        from hvdtrain.launcher.guard import Failure

        return cloudpickle.dumps(Failure(rank, "LaunchError", f"the return value ({type(value).__name__}) cannot "
                                         f"be sent back to the launcher: {err}", "", socket.gethostname()))
