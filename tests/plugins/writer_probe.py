"""A test plug-in dataset that records which processes write under a folder: a marker per writing rank.

`--dataset writer_probe:digits` is the digits dataset. While WRITER_PROBE_OUT and WRITER_PROBE_MARKS are
set, importing this module installs an audit hook (it sees every open-for-writing, mkdir and rename in
the process, whoever makes them), and each write under WRITER_PROBE_OUT appends its path to
WRITER_PROBE_MARKS/rank-R.txt, R being the rank the launcher gave this process (or "none").
No production code knows about it: a run whose config names this dataset imports it on every rank.
"""
from __future__ import annotations

import os
import sys

from hvdtrain.data.datasets import digits  # noqa: F401  (the dataset the config names)

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT


def _rank() -> str:
    # The launcher's own variables, not hvdtrain's answer: the probe must not share the code it checks.
    for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if os.environ.get(name, "").isdigit():
            return os.environ[name]
    return "none"


def _writes(event: str, args: tuple) -> list[object]:
    if event == "open":
        path, mode, flags = args
        if isinstance(path, int):
            return []
        writing = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & _WRITE_FLAGS)
        return [path] if writing else []
    if event in ("os.mkdir", "os.rename", "os.replace"):
        return [args[1] if event != "os.mkdir" else args[0]]
    return []


def _install(out: str, marks: str) -> None:
    out = os.path.abspath(out) + os.sep
    marker = os.path.join(marks, f"rank-{_rank()}.txt")
    busy: list[bool] = []

    def hook(event: str, args: tuple) -> None:
        if busy:  # the marker's own open
            return
        for path in _writes(event, args):
            if isinstance(path, (str, bytes, os.PathLike)) and os.path.abspath(os.fsdecode(path)).startswith(out):
                busy.append(True)
                try:
                    with open(marker, "a") as handle:
                        handle.write(f"{os.getpid()} {event} {os.fsdecode(path)}\n")
                finally:
                    busy.clear()

    sys.addaudithook(hook)


if os.environ.get("WRITER_PROBE_OUT") and os.environ.get("WRITER_PROBE_MARKS"):
    _install(os.environ["WRITER_PROBE_OUT"], os.environ["WRITER_PROBE_MARKS"])
