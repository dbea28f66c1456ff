"""Hostfiles as lists of hosts with slots, and the two forms horovodrun reads.

Pure functions of text; nothing here imports Horovod. Horovod's own hostfile parser crashes
(IndexError) on blank lines, comments and lines without `slots=`, so `to_hostfile` writes only
`host slots=N` lines. Scheduler allocations (Slurm, PBS, LSF) are in `hvdtrain.cluster.allocations`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from hvdtrain.errors import HostsError

# RFC 1123 names and IPv4 addresses; ':' is excluded because Horovod's -H form splits on it.
HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")



@dataclass(frozen=True)
class Host:
    name: str
    slots: int  # workers (ranks) that may run on this host


# ---------------------------------------------------------------- hostfiles


def parse_hostfile(text: str) -> list[Host]:
    """Parse a hostfile: `host`, `host slots=N` or `host:N` per line; `#` comments and blank lines.

    A host without a slot count gets 1 slot, as in Open MPI hostfiles.

    Args:
        text: the file's contents.
    Returns:
        The hosts in file order.
    Raises:
        HostsError: `hostfile line 3: 'node2 slots=x' — slots must be a positive integer`,
            duplicate hosts, or a file with no hosts.

    Example:
        >>> parse_hostfile("# rack 1\\nnode1 slots=2\\nnode2:2\\n")
        [Host(name='node1', slots=2), Host(name='node2', slots=2)]
    """
    hosts: list[Host] = []
    first_line: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            host = _parse_hostfile_line(line)
        except HostsError as err:
            raise HostsError(f"hostfile line {number}: '{line}' — {err}") from None
        if host.name in first_line:
            raise HostsError(f"hostfile line {number}: '{line}' — duplicate host '{host.name}' "
                             f"(first on line {first_line[host.name]}); give one line per host with its total slots")
        first_line[host.name] = number
        hosts.append(host)
    if not hosts:
        raise HostsError("hostfile has no hosts (only comments or blank lines); "
                         "write one 'host slots=N' per line")
    return hosts


def _parse_hostfile_line(line: str) -> Host:
    fields = line.split()
    if len(fields) == 1 and ":" in fields[0]:
        name, _, count = fields[0].partition(":")
        return Host(check_host_name(name), parse_slots(count))
    if len(fields) == 1:
        return Host(check_host_name(fields[0]), 1)
    if len(fields) == 2 and fields[1].startswith("slots="):
        return Host(check_host_name(fields[0]), parse_slots(fields[1][len("slots="):]))
    raise HostsError("expected 'host', 'host slots=N' or 'host:N'")


def check_host_name(name: str) -> str:
    """Return `name` if it is a host name or IPv4 address horovodrun can use; raise otherwise."""
    if not HOST_NAME.fullmatch(name):
        raise HostsError(f"'{name}' is not a host name or IPv4 address")
    return name


def parse_slots(text: str) -> int:
    """A slot count: a positive decimal integer (below 10**9: int() refuses thousands of digits)."""
    if not re.fullmatch(r"[0-9]+", text) or len(text.lstrip("0")) > 9 or int(text) <= 0:
        raise HostsError("slots must be a positive integer (below 1000000000)")
    return int(text)


def to_hostfile(hosts: list[Host]) -> str:
    """The form `horovodrun --hostfile` reads: `host slots=N` per line, nothing else."""
    return "".join(f"{host.name} slots={host.slots}\n" for host in hosts)


def to_h_string(hosts: list[Host]) -> str:
    """The form `horovodrun -H` reads: `host1:2,host2:2`."""
    return ",".join(f"{host.name}:{host.slots}" for host in hosts)


def total_slots(hosts: list[Host]) -> int:
    """The largest `-np` these hosts can take."""
    return sum(host.slots for host in hosts)
