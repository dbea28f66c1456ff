"""The adapter to Horovod's Gloo rendezvous (horovod.runner.http.http_server, horovod.runner.elastic): the servers
hvdtrain's launchers start, the elastic driver over them, and the checks in front of Horovod's handler
(distributed/rendezvous_auth.py says what they are and why).

The launcher half of the one adapter to Horovod (distributed/horovod_runner.py has the rest): every internal of
Horovod 0.28.1's rendezvous that hvdtrain relies on is here, checked against the version it was written for.
Nothing here imports horovod.torch.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from hvdtrain.distributed.horovod_runner import AdapterError, check_version, version


def rendezvous_server(slots: Iterable[Mapping[str, Any]]) -> tuple[Any, int]:
    """Horovod's Gloo rendezvous server behind hvdtrain's checks (no key: bodies bounded, nothing decoded), started
    and initialised with these slots (SlotInfo fields); its port."""
    from horovod.runner.common.util.hosts import SlotInfo

    server = guarded_server("", None)(verbose=0)   # serves from its own thread
    port = server.start()
    server.init([SlotInfo(**slot) for slot in slots])
    return server, port


def rendezvous_server_at(port: int, slots: Iterable[Mapping[str, Any]]) -> Any:
    """Horovod's Gloo rendezvous server on a port chosen by the caller (RendezvousServer.start() picks a random
    one, which tasks that never talk to each other could not agree on), every interface, behind hvdtrain's checks
    (no key: bodies bounded, nothing decoded), serving from a daemon thread; initialised with these slots (SlotInfo
    fields). Returns the server (shutdown() stops it). OSError when the port is taken."""
    from horovod.runner.common.util.hosts import SlotInfo
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    check_version()
    server = RendezvousHTTPServer(("", port), guarded_handler(RendezvousHandler, None), 0)
    server.init([SlotInfo(**slot) for slot in slots])
    threading.Thread(target=server.serve_forever, name="hvdtrain-rendezvous", daemon=True).start()
    return server


def elastic_driver(find_slots: Callable[[], dict[str, int]], min_np: int, max_np: int, *, timeout: int,
                   cooldown_range: tuple[int, int], key: bytes, host: str = "",
                   refused: Callable[[str], None] | None = None) -> tuple[Any, Any, int]:
    """Horovod's ElasticDriver over hosts `find_slots()` returns ({host: slots}), with its rendezvous server
    started on `host` ('' = every interface) behind hvdtrain's checks under the job's `key` (guarded_handler):
    (driver, server, port). Driven through the driver's public methods, as horovod/ray/elastic_v2.py."""
    from horovod.runner.elastic.discovery import HostDiscovery
    from horovod.runner.elastic.driver import ElasticDriver
    from horovod.runner.elastic.rendezvous import create_rendezvous_handler

    check_version()

    class Hosts(HostDiscovery):
        def find_available_hosts_and_slots(self) -> dict[str, int]:
            return find_slots()

    server = guarded_server(host, key, refused)(verbose=0)
    driver = ElasticDriver(server, Hosts(), min_np, max_np, timeout=timeout, cooldown_range=cooldown_range,
                           verbose=0)
    port = server.start(create_rendezvous_handler(driver))
    return driver, server, port


def guarded_server(host: str, key: bytes | None, refused: Callable[[str], None] | None = None) -> type:
    """Horovod's RendezvousServer class, listening on `host` only ('' = every interface, as Horovod does), whose
    handler (Horovod's static one, or the elastic one it is started with) sits behind guarded_handler."""
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer, RendezvousServer
    from horovod.runner.util.network import find_port
    from horovod.runner.util.threads import in_thread

    class GuardedRendezvousServer(RendezvousServer):
        def start(self, handler_cls: type = RendezvousHandler) -> int:
            handler = guarded_handler(handler_cls, key, refused)
            self._httpd, port = find_port(lambda addr: RendezvousHTTPServer((host, addr[1]), handler,
                                                                            self._verbose))
            self._listen_thread = in_thread(target=self._httpd.serve_forever)
            return int(port)

    return GuardedRendezvousServer


def guarded_handler(handler: type, key: bytes | None, refused: Callable[[str], None] | None = None) -> type:
    """`handler` (a Horovod rendezvous handler class, static or elastic) behind distributed/rendezvous_auth.py's
    checks: with a `key`, every request without its token refused; bodies over MAX_BODY refused unread; a worker
    registration only when signed with `key` (never without one) and decoded without running code; malformed paths
    answered 400 (Horovod's handler raised, printing a traceback per request). `refused` gets one safe line per
    refused request."""
    from horovod.runner.http.http_server import KVStoreHandler

    from hvdtrain.distributed import rendezvous_auth as auth

    def refuse(request: Any, status: int, why: str) -> None:
        # Counted before answering: whoever sees the answer sees the count.
        if refused is not None:
            refused(f"{request.command} {auth.safe_text(request.path)} from {request.client_address[0]}: {why}")
        request.send_status_code(status)

    class GuardedRendezvousHandler(handler):
        def _scope_key(self) -> tuple[str, str] | None:
            """(scope, key) of a request of a worker of the job, else None (answered already)."""
            try:
                if key is not None:   # a job without a key (plain horovodrun's): bounded, not authenticated
                    auth.check_token(key, self.headers.get(auth.TOKEN_HEADER))
            except auth.Refused as no:
                self.close_connection = True   # its body, if any, is never read
                refuse(self, 403, str(no))
                return None
            parts = self.path.split("/")
            if len(parts) != 3 or not parts[1] or not parts[2]:
                refuse(self, 400, "not /scope/key")
                return None
            return parts[1], parts[2]

        def do_GET(self) -> None:
            if self._scope_key() is not None:
                try:
                    super().do_GET()
                except Exception as err:   # e.g. rank_and_size of a key that is not host:slot
                    refuse(self, 400, type(err).__name__)

        def do_DELETE(self) -> None:
            if self._scope_key() is not None:
                super().do_DELETE()

        def do_PUT(self) -> None:
            found = self._scope_key()
            if found is None:
                return
            scope, name = found
            try:
                length = auth.body_length(self.headers.get("Content-Length"))
                body = self.rfile.read(length)
            except auth.Refused as no:
                self.close_connection = True   # the unread body must not be taken for the next request
                refuse(self, 413, str(no))
                return
            except OSError:
                refuse(self, 408, "body not received in time")
                return
            if scope == auth.REGISTRATION_SCOPE and not hasattr(self, "_put_worker_addresses"):
                refuse(self, 404, "no elastic driver here")
                return
            if scope != auth.REGISTRATION_SCOPE:   # Gloo's raw addresses: stored, never decoded (as Horovod does)
                KVStoreHandler._put_value(self, scope, name, body)
                self.send_status_code(200)
                return
            try:
                host, slot, addresses, worker_key = auth.registration(key, self.path, body,
                                                                      self.headers.get(auth.AUTH_HEADER))
            except auth.Refused as no:
                refuse(self, 403, str(no))
                return
            self._put_worker_addresses(host, slot, addresses, worker_key)
            KVStoreHandler._put_value(self, scope, name, body)
            self.send_status_code(200)

    return GuardedRendezvousHandler


@contextmanager
def horovodrun_rendezvous_guarded(key: bytes | None, host: str,
                                  refused: Callable[[str], None] | None = None) -> Iterator[None]:
    """Inside: the Gloo rendezvous horovodrun starts in this process (gloo_run's RendezvousServer, static and
    elastic, Horovod 0.28.1) listens on `host` and sits behind guarded_handler under `key`. Raises AdapterError,
    before patching, when Horovod's launcher no longer has that name."""
    from horovod.runner import gloo_run

    if not hasattr(gloo_run, "RendezvousServer"):
        raise AdapterError(f"Horovod {version()}'s horovod.runner.gloo_run no longer has RendezvousServer: the "
                           "rendezvous would run unguarded")
    saved = gloo_run.RendezvousServer
    gloo_run.RendezvousServer = guarded_server(host, key, refused)
    try:
        yield
    finally:
        gloo_run.RendezvousServer = saved
