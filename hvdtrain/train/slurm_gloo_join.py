"""Joining a Gloo job that srun started, the acting half (cluster/slurm_gloo_env.py computes the variables, without
acting): rank 0 serves Horovod's rendezvous on the step's first node, every other task waits until it answers, then
all set the variables Horovod's init() reads. Nothing happens outside such a step. Called once per process by
train/run_start.py, before Horovod starts: for `python -m hvdtrain` and a script's Trainer alike."""
from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import MutableMapping
from typing import Any

from hvdtrain.cluster.slurm_gloo_env import gloo_env
from hvdtrain.distributed import horovod_rendezvous
from hvdtrain.environment.process import from_env
from hvdtrain.errors import HostsError

# Rank 0's rendezvous server lives as long as the process (Gloo reads it during hvd.init()).
_SERVERS: list[Any] = []


def join(env: MutableMapping[str, str] | None = None, timeout: float = 300) -> str:
    """Set Horovod's Gloo variables in `env` (os.environ) for a task of an srun step, starting or awaiting the
    rendezvous; returns one line saying so ('' where this is no such task). `timeout`: how long the other
    tasks wait for rank 0's server (rank 0 may start late on a busy node)."""
    env = os.environ if env is None else env
    found, everyone = gloo_env(env)
    if not found:
        return ""
    me = from_env(found)
    assert me is not None   # found holds horovodrun --gloo's rank variables
    first, port = found["HOROVOD_GLOO_RENDEZVOUS_ADDR"], int(found["HOROVOD_GLOO_RENDEZVOUS_PORT"])
    try:
        address = socket.gethostbyname(first)
    except OSError as err:
        raise HostsError(f"the step's first node {first!r} does not resolve here ({err}): Gloo needs every node "
                         "to reach it by name") from err
    if me.is_root:
        try:
            _SERVERS.append(horovod_rendezvous.rendezvous_server_at(port, [dataclasses.asdict(s) for s in everyone]))
        except OSError as err:
            raise HostsError(f"port {port} on {first} is taken ({err}): set HVDTRAIN_GLOO_PORT to a free port, the "
                             "same for every task") from err
    else:
        _await(address, port, timeout)
    env.update({**found, "HOROVOD_GLOO_RENDEZVOUS_ADDR": address})
    return f"Gloo over srun: rank {me.rank} of {me.size}, rendezvous on {first} ({address}:{port})"


def _await(address: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((address, port), timeout=5):
                return
        except OSError as err:
            if time.monotonic() > deadline:
                raise HostsError(f"rank 0's Gloo rendezvous at {address}:{port} did not answer in {timeout:.0f} s "
                                 f"({err}): did rank 0 start? (HVDTRAIN_GLOO_PORT must be the same for every task)") \
                    from err
            time.sleep(0.2)
