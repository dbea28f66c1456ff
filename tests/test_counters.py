"""Counters, not timings: what one training step puts on the wire, under real horovodrun -np 2.

Bytes allreduced per step = 4 x parameters (fp32), 2 x with fp16 compression; and the number of
allreduce operations Horovod's background thread performs per step follows the fusion settings:
one fused operation per step with the default threshold, one per gradient tensor with fusion off.
The operation count is read from Horovod's timeline (HOROVOD_TIMELINE), which logs every tensor of a
fused operation in one burst of consecutive "ALLREDUCE" begin events.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import horovodrun, show

pytestmark = pytest.mark.multirank


def rank_counters(stdout: str) -> list[dict]:
    found = [json.loads(m) for m in re.findall(r"COUNTERS (\{.*\})", stdout)]
    return sorted(found, key=lambda r: r["rank"])


def fused_operations(timeline: Path, gradients: set[str]) -> list[int]:
    """Sizes (tensor counts) of the allreduce operations of `gradients` (tensor names), in order, read
    from a Horovod timeline. Other collectives (metrics, object gathers) are left out."""
    text = timeline.read_text().strip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("name") == "process_name" and "name" in e.get("args", {})}
    operations: list[int] = []
    run = 0
    for event in events:
        begins_gradient = (event.get("ph") == "B" and event.get("name") == "ALLREDUCE"
                           and names.get(event["pid"]) in gradients)
        if begins_gradient:
            run += 1
        elif run:
            operations.append(run)
            run = 0
    if run:
        operations.append(run)
    return operations


def run_counters(tmp_path: Path, env: dict[str, str]) -> tuple[list[dict], list[int]]:
    timeline = tmp_path / "timeline.json"
    proc = horovodrun(2, ["tests/ranks/counters.py"], "gloo", env={"HOROVOD_TIMELINE": str(timeline), **env})
    assert proc.returncode == 0, show(proc)
    ranks = rank_counters(proc.stdout)
    assert [r["rank"] for r in ranks] == [0, 1], show(proc)
    return ranks, fused_operations(timeline, {f"allreduce.{name}" for name in ranks[0]["names"]})


def test_bytes_per_step_and_one_fused_allreduce_per_step(tmp_path):
    # A long cycle gives the whole backward pass (well under 1 ms here) to one negotiation cycle.
    ranks, operations = run_counters(tmp_path, {"HOROVOD_CYCLE_TIME": "300"})
    for r in ranks:
        assert r["steps"] == 3 and r["size"] == 2
        assert r["fp32_bytes"] == 4 * r["params"] * r["steps"], r
        assert r["fp16_bytes"] == 2 * r["params"] * r["fp16_steps"], r
        assert r["fp32_calls"] == r["tensors"] * r["steps"], r
        assert r["fp16_calls"] == r["tensors"] * r["fp16_steps"], r
        # One name per parameter: nothing else (metrics, stop flags) rides on the gradient path.
        assert r["names"] == sorted(["1.weight", "1.bias", "3.weight", "3.bias", "5.weight", "5.bias"]), r
    tensors = ranks[0]["tensors"]
    # Default fusion threshold (64 MB) holds all gradients: one operation of every tensor, each step.
    assert operations == [tensors] * (ranks[0]["steps"] + ranks[0]["fp16_steps"]), operations


def test_fusion_off_gives_one_allreduce_per_tensor(tmp_path):
    ranks, operations = run_counters(tmp_path, {"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CYCLE_TIME": "300"})
    r = ranks[0]
    assert r["fp32_bytes"] == 4 * r["params"] * r["steps"], r
    assert operations == [1] * (r["tensors"] * (r["steps"] + r["fp16_steps"])), operations
