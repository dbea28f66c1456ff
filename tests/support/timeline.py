"""Test instrumentation: what Horovod's timeline (HOROVOD_TIMELINE, written by rank 0) says went over the wire."""
from __future__ import annotations

import collections
import json
from pathlib import Path

import torch

WIRE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int8": 1,
              "uint8": 1, "bool": 1}


def timeline_ops(path: Path, op: str) -> dict[str, list[tuple[str, int]]]:
    """For each tensor of collective `op` (e.g. "allreduce"), (wire dtype, bytes) per call."""
    events = json.loads(path.read_text())
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name" and "name" in e["args"]}
    seen: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
    for event in events:
        args, name = event.get("args", {}), names.get(event.get("pid"), "")
        if event.get("ph") == "E" and "dtype" in args and name.startswith(f"{op}."):
            numel = torch.Size(json.loads(args["shape"])).numel()
            seen[name.removeprefix(f"{op}.")].append((args["dtype"], numel * WIRE_BYTES[args["dtype"]]))
    return seen


def assert_half_the_bytes(full: Path, half: Path, params: set[str], half_dtype: str) -> int:
    """Every parameter's gradient went over the wire as float32 in the `full` timeline and as `half_dtype`, at exactly
    half the bytes, in the `half` one. Returns the float32 bytes of one step's gradients."""
    plain = {k: v for k, v in timeline_ops(full, "allreduce").items() if k in params}
    halved = {k: v for k, v in timeline_ops(half, "allreduce").items() if k in params}
    assert plain.keys() == halved.keys() == params
    assert {dtype for calls in plain.values() for dtype, _ in calls} == {"float32"}
    assert {dtype for calls in halved.values() for dtype, _ in calls} == {half_dtype}
    for name in params:
        assert {size for _, size in halved[name]} == {plain[name][0][1] // 2}, name
    per_step = sum(calls[0][1] for calls in plain.values())
    assert sum(calls[0][1] for calls in halved.values()) * 2 == per_step
    return per_step
