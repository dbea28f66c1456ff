"""Reading W&B's offline run files (`<run>/wandb/offline-run-*/run-<id>.wandb`) without wandb's service.

wandb 0.31 has no Python reader of its own; the file is a LevelDB-style log (32 KiB blocks of records with a
7-byte header: CRC32C, length, type FULL/FIRST/MIDDLE/LAST) after a 7-byte file header (`:W&B`, magic
0xBEE1, version), each record a `wandb_internal_pb2.Record`. Used to resume a run without logging its steps
twice, and by the tests to read back what an offline run holds.
"""
from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def payloads(path: Path) -> Iterator[bytes]:
    """The file's records as bytes, in order; a torn last record (a killed writer) ends the scan."""
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file")
    position, pending = HEADER, b""
    while position + HEADER <= len(data):
        left_in_block = BLOCK - position % BLOCK
        if left_in_block < HEADER:  # the block's tail is padding
            position += left_in_block
            continue
        length, kind = struct.unpack_from("<HB", data, position + 4)
        body = data[position + HEADER:position + HEADER + length]
        if len(body) < length or kind not in (FULL, FIRST, MIDDLE, LAST):
            return
        position += HEADER + length
        if kind == FULL:
            yield body
        elif kind == FIRST:
            pending = body
        else:
            pending += body
            if kind == LAST:
                yield pending
                pending = b""


def records(path: Path) -> Iterator[Any]:
    """Each record of a run file as wandb's own protobuf message (`Record`)."""
    from wandb.proto import wandb_internal_pb2

    for body in payloads(path):
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]  # generated code, no stubs
        record.ParseFromString(body)
        yield record


def history(folder: Path) -> list[dict[str, Any]]:
    """Every logged row (`_step` and the metrics) of all offline runs under `folder` (a run folder's wandb/)."""
    rows = []
    for path in _files(folder, "*"):
        for record in records(path):
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows


def last_steps(folder: Path, run_id: str) -> dict[str, int]:
    """The last step of each metric the offline files of run `run_id` already hold."""
    high: dict[str, int] = {}
    for path in _files(folder, run_id):
        for record in records(path):
            if record.WhichOneof("record_type") != "history":
                continue
            row = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
            step = int(json.loads(row.get("_step", "0")))
            for name in row:
                if not name.startswith("_"):
                    high[name] = max(high.get(name, -1), step)
    return high


def _files(folder: Path, run_id: str) -> list[Path]:
    """The run files of `run_id` ("*": every run) in time order, once each (wandb adds a latest-run link)."""
    return sorted(path for path in folder.glob(f"*run-*-{run_id}/run-{run_id}.wandb") if not path.parent.is_symlink())
