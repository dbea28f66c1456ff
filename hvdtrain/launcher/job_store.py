"""The store `hvdtrain.launch()` puts in place of Horovod's KVStoreServer: it serves the sealed job and
takes back only results sealed with the launch's key.

Horovod 0.28.1's `horovod.runner.run` (launch.py, `_run_static`) starts a KVStoreServer, an HTTP server on
every interface that stores whatever anyone PUTs and serves it to whoever GETs: the driver PUTs the
pickled job at /runfunc/func, every worker (`python -m horovod.runner.run_task ADDR PORT`) GETs and
unpickles it, and PUTs its pickled result at /runfunc_result/RANK, which the driver GETs and unpickles.
Anyone who reaches that port could read the job (its credentials included) or PUT a pickle that the
workers or the launcher would unpickle: code execution on either.

In its place, for the length of one launch (`serving()`), this store:
- serves one thing: the sealed job, as raw ciphertext at GET /runfunc/sealed for hvdtrain's own worker entry
  (sealed_task.py, which opens it with the launch's key before it unpickles anything), and as a pickled `SealedJob`
  (a file path and the same ciphertext) at GET /runfunc/func where Horovod's run_task starts the workers;
- refuses (403) every PUT but /runfunc_result/RANK for a rank of the job, once, whose body is the pickle
  of one `bytes` object (checked by reading the pickle's opcodes, never by unpickling it) that opens with
  the launch's key as that rank's result;
- keeps the accepted results in this process: the launcher's own reads come from here, not over HTTP;
- listens on the address of the job's network interface when it is known (127.0.0.1 on one machine).

The driver's own PUT and GETs are redirected in-process by the adapter (distributed/horovod_runner.py,
`job_store_replaced`), which checks that Horovod's launcher still calls the names it replaces and fails loudly
when a Horovod release changes that.
"""
from __future__ import annotations

import base64
import binascii
import hmac
import os
import pickletools
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import cloudpickle

from hvdtrain.distributed import horovod_runner
from hvdtrain.distributed.rendezvous_auth import safe_text
from hvdtrain.errors import LaunchError
from hvdtrain.launcher.sealed import RESULT_AUTH_HEADER, result_purpose, result_token, unseal

JOB_PATH = "/runfunc/func"
RAW_JOB_PATH = "/runfunc/sealed"
RESULT_SCOPE = "/runfunc_result/"
REQUEST_TIMEOUT_S = 10
# A rank's result as Horovod's worker PUTs it (base64 of the pickled, sealed return value): larger ones are refused
# unread. HVDTRAIN_LAUNCH_MAX_RESULT_MB raises it for a function that returns more (return paths, not tensors).
MAX_RESULT_ENV = "HVDTRAIN_LAUNCH_MAX_RESULT_MB"
MAX_RESULT_MB = 256
# Every body being read at once, together, stays under this; a PUT that does not fit waits for room, then is
# refused. With the per-body deadline below, a stranger's slow or huge PUTs hold the launcher's memory to it.
INFLIGHT_FACTOR = 2
BODY_DEADLINE_S = 30.0     # plus a second per 8 MiB of body: a trickled body is cut off
KEEP_REFUSED = 100
# Opcodes of `pickle.dumps(some_bytes)` at protocol 3 to 5: nothing that imports, calls or builds objects.
_BYTES_OPS = {"PROTO", "FRAME", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8", "MEMOIZE", "BINPUT", "LONG_BINPUT",
              "STOP"}


def max_result_bytes(environ: Mapping[str, str]) -> int:
    """The largest result body the store reads, from MAX_RESULT_ENV (MB) or MAX_RESULT_MB.

    Example:
        >>> max_result_bytes({}), max_result_bytes({"HVDTRAIN_LAUNCH_MAX_RESULT_MB": "1"})
        (268435456, 1048576)
    """
    text = environ.get(MAX_RESULT_ENV, "").strip()
    if text and not text.isdigit():
        raise LaunchError(f"{MAX_RESULT_ENV}={text!r}: expected a whole number of MB, e.g. {MAX_RESULT_MB}")
    return int(text or MAX_RESULT_MB) * 2**20


def bytes_of_pickle(data: bytes) -> bytes:
    """The one bytes object a pickle holds, read from its opcodes without unpickling; ValueError otherwise."""
    found: list[bytes] = []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name not in _BYTES_OPS:
                raise ValueError(f"pickle opcode {op.name} where only bytes are expected")
            if isinstance(arg, bytes):
                found.append(arg)
    except ValueError:
        raise
    except Exception as err:   # truncated or corrupt: genops raises assorted errors
        raise ValueError(f"not a pickle: {err}") from None
    if len(found) != 1:
        raise ValueError("expected the pickle of one bytes object")
    return found[0]


class JobStore:
    """One launch's store. `start_server()` / `shutdown_server()` as Horovod's KVStoreServer has them.

    Args:
        job_body: what GET /runfunc/func answers: base64 of the pickled SealedJob (as Horovod's codec writes).
        raw_job: what GET /runfunc/sealed answers: the job's ciphertext alone, for launcher/sealed_task.py, which
            opens it before unpickling anything.
        key: the launch's key; num_proc: the job's ranks; host: the address to listen on ('' = every one).
    """

    def __init__(self, job_body: bytes, key: bytes, num_proc: int, host: str = "",
                 max_result: int | None = None, raw_job: bytes = b"") -> None:
        self.job_body = job_body
        self.raw_job = raw_job
        self.key = key
        self.num_proc = num_proc
        self.host = host
        self.max_result = max_result if max_result is not None else max_result_bytes(os.environ)
        self.results: dict[int, bytes] = {}
        self.refused: list[str] = []   # "METHOD path from ADDR" of the first KEEP_REFUSED refused requests
        self.refused_count = 0
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)
        self.inflight = 0              # bytes of the bodies being read now
        self.httpd: ThreadingHTTPServer | None = None

    def start_server(self) -> int:
        store = self

        class Handler(_Handler):
            owner = store

        self.httpd = ThreadingHTTPServer((self.host, 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, name="hvdtrain-job-store", daemon=True).start()
        return int(self.httpd.server_address[1])

    def shutdown_server(self) -> None:
        """Stop listening (again: a no-op)."""
        httpd, self.httpd = self.httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()

    def refuse(self, line: str) -> None:
        with self.lock:
            self.refused_count += 1
            if len(self.refused) < KEEP_REFUSED:   # a flood of requests must not grow this list without end
                self.refused.append(line)

    def wanted(self, path: str, length: int, token: str | None) -> int | None:
        """The rank a PUT of `length` bytes at `path` may be a result of, or None: refused before its body is read
        (not a result path, not a rank of the job, a rank already in, larger than a result may be, or without the
        worker's proof of the launch's key for this rank and length: sealed.result_token)."""
        rank_text = path[len(RESULT_SCOPE):] if path.startswith(RESULT_SCOPE) else ""
        if not rank_text.isdigit() or not 0 <= int(rank_text) < self.num_proc or not 0 <= length <= self.max_result:
            return None
        if not token or not hmac.compare_digest(result_token(self.key, int(rank_text), length), token.strip()):
            return None
        with self.lock:
            return None if int(rank_text) in self.results else int(rank_text)

    @contextmanager
    def room_for(self, length: int) -> Iterator[bool]:
        """Inside: `length` bytes counted against the in-flight budget; False when no room came within the request
        timeout (the caller refuses the PUT unread)."""
        budget = INFLIGHT_FACTOR * self.max_result
        with self.room:
            got = self.room.wait_for(lambda: self.inflight + length <= budget, timeout=REQUEST_TIMEOUT_S)
            if got:
                self.inflight += length
        try:
            yield got
        finally:
            if got:
                with self.room:
                    self.inflight -= length
                    self.room.notify_all()

    def accept(self, path: str, body: bytes) -> bool:
        """Whether a worker's PUT (its token checked already) is a sealed result of a rank not yet in; it is kept
        when it is."""
        rank_text = path[len(RESULT_SCOPE):] if path.startswith(RESULT_SCOPE) else ""
        if not rank_text.isdigit() or not 0 <= int(rank_text) < self.num_proc:
            return False
        rank = int(rank_text)
        try:
            sealed = bytes_of_pickle(base64.b64decode(body, validate=True))
            opened = unseal(self.key, result_purpose(rank), sealed)
        except (ValueError, binascii.Error):   # sealed.Forged is a ValueError
            return False
        with self.lock:
            if rank in self.results:
                return False
            self.results[rank] = opened
        return True

    def result(self, rank: int) -> Any:
        """Rank's return value (unpickled here: it was sealed with the launch's key); RuntimeError if none came,
        as Horovod's own read raises."""
        with self.lock:
            opened = self.results.get(rank)
        if opened is None:
            raise RuntimeError(f"rank {rank} sent no result")
        return cloudpickle.loads(opened)


class _Handler(BaseHTTPRequestHandler):
    owner: JobStore
    timeout = REQUEST_TIMEOUT_S

    def do_GET(self) -> None:   # noqa: N802 - http.server's naming
        if self.path == JOB_PATH:
            self._answer(200, self.owner.job_body)
        elif self.path == RAW_JOB_PATH and self.owner.raw_job:
            self._answer(200, self.owner.raw_job)
        else:
            self._answer(404)

    def do_PUT(self) -> None:   # noqa: N802
        text = self.headers.get("Content-Length", "").strip()
        length = int(text) if text.isdigit() and len(text) < 20 else -1
        # Read the body only where a result may come, of a size a result may have, with room in the budget;
        # anything else is refused unread.
        if self.owner.wanted(self.path, length, self.headers.get(RESULT_AUTH_HEADER)) is not None:
            with self.owner.room_for(length) as room:
                body = self._body(length) if room else None
                if body is not None and self.owner.accept(self.path, body):
                    self._answer(200)
                    return
        self.owner.refuse(f"PUT {safe_text(self.path, 80)} from {self.client_address[0]}")
        self._answer(403)
        self.close_connection = True

    def _body(self, length: int) -> bytes | None:
        """The body, read in chunks against one deadline for all of it; None when it does not arrive in time."""
        deadline = time.monotonic() + BODY_DEADLINE_S + length / (8 * 2**20)
        chunks, left = [], length
        try:
            while left:
                if time.monotonic() > deadline:
                    return None
                chunk = self.rfile.read1(min(left, 2**20))
                if not chunk:
                    return None
                chunks.append(chunk)
                left -= len(chunk)
        except OSError:   # the socket's own timeout (REQUEST_TIMEOUT_S without a byte)
            return None
        return b"".join(chunks)

    def _answer(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:   # noqa: A002 - http.server's signature
        pass


@contextmanager
def serving(store: JobStore) -> Iterator[None]:
    """Inside: `horovod.runner.run` of a function uses `store`, its job and its results, in this process.

    One launch at a time per process (a second waits): the patch is on Horovod's module.
    """
    def put(addr: str, port: int, scope: str, key: str, value: Any) -> None:
        if (scope, key) != ("runfunc", "func"):
            raise RuntimeError(f"unexpected put of {scope}/{key} by Horovod's launcher")
        if addr != store.host and store.host:
            raise LaunchError(f"Horovod sends the workers to {addr}, but the job store listens on {store.host}; "
                              "name the interface with network_interfaces=[...]")
        # The store serves the SealedJob; Horovod's own pickle of it (in a closure) is not needed.

    def read(addr: str, port: int, scope: str, key: str) -> Any:
        if scope != "runfunc_result":
            raise RuntimeError(f"unexpected read of {scope}/{key} by Horovod's launcher")
        return store.result(int(key))

    try:
        with horovod_runner.job_store_replaced(lambda verbose=0: store, put, read):
            yield
    except horovod_runner.AdapterError as err:
        raise LaunchError(f"hvdtrain.launch(): {err}: not launching with Horovod's unauthenticated job store "
                          "(use `hvdtrain launch` instead)") from None
    finally:
        if store.refused_count:
            sys.stderr.write(f"hvdtrain: warning: launch(): refused {store.refused_count} request(s) to the job "
                             f"store that were not this launch's, the first: {store.refused[0]}\n")
