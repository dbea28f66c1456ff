"""A free TCP port on loopback, for a server a test starts (MLflow, S3, Slurm's daemons)."""
from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
