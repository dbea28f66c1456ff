"""Hosts of a scheduler allocation: Slurm, PBS/Torque and LSF environment variables.

Pure functions of text and environment mappings (no Horovod). Horovod has no Slurm support
(Horovod issues #1038, #2097); `hvdtrain hosts from-env` turns these into a hostfile.

Slurm hostlist expansion is our own: the one maintained Python library for it (python-hostlist) is
GPL-2.0+, which an Apache-2.0 package should not import.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from hvdtrain.cluster.hostfile import HOST_NAME, Host, check_host_name, parse_slots
from hvdtrain.errors import HostsError

MAX_HOSTS = 100_000  # a typo like node[1-99999999] must fail fast, not exhaust memory


def expand_hostlist(expression: str) -> list[str]:
    """Expand a Slurm hostlist such as `node[01-04,07],gpu[1-2]-ib` into host names.

    Zero padding of a range's start is kept (`[08-11]` -> 08, 09, 10, 11); several bracket
    groups in one name expand left to right, the last group varying fastest (as Slurm does).

    Example:
        >>> expand_hostlist("n[1-2]-ib,login")
        ['n1-ib', 'n2-ib', 'login']
    """
    names: list[str] = []
    for item in _split_top_level(expression):
        if not item:
            raise HostsError(f"hostlist {expression!r}: empty name (two commas in a row, or a trailing comma?)")
        names.extend(_expand_item(item, expression))
        if len(names) > MAX_HOSTS:
            raise HostsError(f"hostlist {expression!r} expands to more than {MAX_HOSTS} hosts")
    return names


def _split_top_level(expression: str) -> list[str]:
    """Split on commas outside brackets; check brackets pair up and do not nest."""
    items, depth, start = [], 0, 0
    for index, char in enumerate(expression):
        if char == "[":
            if depth:
                raise HostsError(f"hostlist {expression!r}: nested '['")
            depth = 1
        elif char == "]":
            if not depth:
                raise HostsError(f"hostlist {expression!r}: ']' without '['")
            depth = 0
        elif char == "," and not depth:
            items.append(expression[start:index].strip())
            start = index + 1
    if depth:
        raise HostsError(f"hostlist {expression!r}: '[' without ']'")
    items.append(expression[start:].strip())
    return items


def _expand_item(item: str, expression: str) -> list[str]:
    # re.split with a group alternates text outside brackets with the text inside them.
    pieces = re.split(r"\[([^\]]*)\]", item)
    names = [pieces[0]]
    for ranges, literal in zip(pieces[1::2], pieces[2::2], strict=True):
        values = _expand_ranges(ranges, expression)
        if len(names) * len(values) > MAX_HOSTS:
            raise HostsError(f"hostlist {expression!r} expands to more than {MAX_HOSTS} hosts")
        names = [name + value + literal for name in names for value in values]
    for name in names:
        if not HOST_NAME.fullmatch(name):
            raise HostsError(f"hostlist {expression!r}: {name!r} is not a host name")
    return names


def _expand_ranges(ranges: str, expression: str) -> list[str]:
    values: list[str] = []
    for part in ranges.split(","):
        part = part.strip()
        match = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", part)
        if not match:
            raise HostsError(f"hostlist {expression!r}: {'[' + ranges + ']'!r} needs numbers or ranges like 01-04,07")
        low, high = match.group(1), match.group(2) or match.group(1)
        if max(len(low), len(high)) > 18:  # int() refuses thousands of digits; no node number is this long
            raise HostsError(f"hostlist {expression!r}: '{part}' is not a node number (more than 18 digits)")
        if int(high) < int(low):
            raise HostsError(f"hostlist {expression!r}: range '{part}' runs backwards")
        if int(high) - int(low) >= MAX_HOSTS:
            raise HostsError(f"hostlist {expression!r} expands to more than {MAX_HOSTS} hosts")
        width = len(low)  # Slurm pads to the width of the range's first number
        values.extend(str(number).zfill(width) for number in range(int(low), int(high) + 1))
    return values


def expand_task_counts(text: str, variable: str) -> list[int]:
    """Expand Slurm's compressed counts: `2(x3),1` -> [2, 2, 2, 1].

    Example:
        >>> expand_task_counts("4(x2),2", "SLURM_TASKS_PER_NODE")
        [4, 4, 2]
    """
    counts: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*([0-9]+)(?:\(x([0-9]+)\))?\s*", part)
        too_long = match and any(len(count or "") > 9 for count in match.groups())  # int() refuses 4301+ digits
        if not match or too_long or int(match.group(1)) <= 0 or (match.group(2) and int(match.group(2)) <= 0):
            raise HostsError(f"{variable}={text!r}: {part!r} is not a positive count like 2 or 2(x3)")
        repeat = int(match.group(2) or 1)
        if len(counts) + repeat > MAX_HOSTS:
            raise HostsError(f"{variable}={text!r} describes more than {MAX_HOSTS} hosts")
        counts.extend([int(match.group(1))] * repeat)
    return counts


def from_slurm(env: Mapping[str, str]) -> list[Host]:
    """Hosts of a Slurm allocation: SLURM_JOB_NODELIST with SLURM_TASKS_PER_NODE.

    SLURM_TASKS_PER_NODE (always set in a job) must give one count per node. Without it,
    SLURM_NTASKS_PER_NODE (set by --ntasks-per-node) is used; a single value there applies to
    every node. With neither, each node gets 1 slot.
    """
    nodelist_var = "SLURM_JOB_NODELIST" if env.get("SLURM_JOB_NODELIST", "").strip() else "SLURM_NODELIST"
    names = expand_hostlist(env[nodelist_var])
    _refuse_duplicates(names, f"{nodelist_var}={env[nodelist_var]!r}")
    if env.get("SLURM_TASKS_PER_NODE", "").strip():
        counts = expand_task_counts(env["SLURM_TASKS_PER_NODE"], "SLURM_TASKS_PER_NODE")
        source = "SLURM_TASKS_PER_NODE"
    elif env.get("SLURM_NTASKS_PER_NODE", "").strip():
        counts = expand_task_counts(env["SLURM_NTASKS_PER_NODE"], "SLURM_NTASKS_PER_NODE")
        source = "SLURM_NTASKS_PER_NODE"
        if len(counts) == 1:
            counts = counts * len(names)
    else:
        counts = [1] * len(names)
        source = ""
    if len(counts) != len(names):
        raise HostsError(f"{source}={env[source]!r} gives {len(counts)} counts for the {len(names)} "
                         f"nodes of {nodelist_var}={env[nodelist_var]!r}")
    return [Host(name, count) for name, count in zip(names, counts, strict=True)]


def _refuse_duplicates(names: list[str], where: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise HostsError(f"{where}: host '{name}' appears twice")
        seen.add(name)


# ---------------------------------------------------------------- PBS and LSF


def from_pbs_nodefile(text: str) -> list[Host]:
    """Hosts of a PBS/Torque allocation: PBS_NODEFILE has one line per slot, so repeats count."""
    return _count_repeats(text.split(), "PBS_NODEFILE")


def from_lsf(env: Mapping[str, str]) -> list[Host]:
    """Hosts of an LSF allocation: LSB_MCPU_HOSTS (`h1 2 h2 2`), else LSB_HOSTS (`h1 h1 h2 h2`)."""
    if env.get("LSB_MCPU_HOSTS", "").strip():
        text = env["LSB_MCPU_HOSTS"]
        fields = text.split()
        if len(fields) % 2:
            raise HostsError(f"LSB_MCPU_HOSTS={text!r}: expected pairs of 'host slots'")
        hosts = []
        for name, count in zip(fields[0::2], fields[1::2], strict=True):
            try:
                hosts.append(Host(check_host_name(name), parse_slots(count)))
            except HostsError as err:
                raise HostsError(f"LSB_MCPU_HOSTS={text!r}: '{name} {count}' — {err}") from None
        _refuse_duplicates([host.name for host in hosts], f"LSB_MCPU_HOSTS={text!r}")
        return hosts
    return _count_repeats(env.get("LSB_HOSTS", "").split(), "LSB_HOSTS")


def _count_repeats(names: list[str], source: str) -> list[Host]:
    """One entry per slot -> hosts in order of first appearance with their counts."""
    counts: dict[str, int] = {}
    for name in names:
        try:
            counts[check_host_name(name)] = counts.get(name, 0) + 1
        except HostsError as err:
            raise HostsError(f"{source}: {err}") from None
    if not counts:
        raise HostsError(f"{source} lists no hosts")
    return [Host(name, count) for name, count in counts.items()]


# ---------------------------------------------------------------- whichever scheduler this is


def from_env(env: Mapping[str, str], read_text: Callable[[str], str]) -> tuple[str, list[Host]]:
    """The scheduler whose variables are set, and its hosts.

    Args:
        env: environment variables, e.g. `os.environ`.
        read_text: reads a file by path (PBS_NODEFILE names a file).
    Returns:
        (`slurm` | `pbs` | `lsf`, hosts).
    """
    if env.get("SLURM_JOB_NODELIST", "").strip() or env.get("SLURM_NODELIST", "").strip():
        return "slurm", from_slurm(env)
    if env.get("PBS_NODEFILE", "").strip():
        path = env["PBS_NODEFILE"]
        try:
            text = read_text(path)
        except OSError as err:
            raise HostsError(f"PBS_NODEFILE={path!r} cannot be read: {err.strerror or err}") from None
        except UnicodeDecodeError:
            raise HostsError(f"PBS_NODEFILE={path!r} is not a text file") from None
        return "pbs", from_pbs_nodefile(text)
    if env.get("LSB_MCPU_HOSTS", "").strip() or env.get("LSB_HOSTS", "").strip():
        return "lsf", from_lsf(env)
    raise HostsError("no scheduler allocation in the environment: expected SLURM_JOB_NODELIST (Slurm), "
                     "PBS_NODEFILE (PBS) or LSB_MCPU_HOSTS / LSB_HOSTS (LSF); run inside a job, "
                     "or write a hostfile and check it with `hvdtrain hosts check FILE`")
