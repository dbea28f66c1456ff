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

from support.processes import horovodrun, show


def rank_counters(stdout: str) -> list[dict]:
    found = [json.loads(m) for m in re.findall(r"COUNTERS (\{.*\})", stdout)]
    return sorted(found, key=lambda r: r["rank"])


def read_timeline(timeline: Path) -> tuple[list[dict], dict[int, str]]:
    text = timeline.read_text().strip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("name") == "process_name" and "name" in e.get("args", {})}
    return events, names


def fused_operations(timeline: Path, gradients: set[str]) -> list[int]:
    """Sizes (tensor counts) of the allreduce operations of `gradients` (tensor names), in order, read
    from a Horovod timeline. Other collectives (metrics, object gathers) are left out."""
    events, names = read_timeline(timeline)
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


def count_events(timeline: Path, gradients: set[str], event_name: str) -> int:
    """How many gradient tensors logged a begin of `event_name` (ALLREDUCE, MEMCPY_IN_FUSION_BUFFER...)."""
    events, names = read_timeline(timeline)
    return sum(1 for e in events if e.get("ph") == "B" and e.get("name") == event_name
               and names.get(e["pid"]) in gradients)


def run_counters(tmp_path: Path, env: dict[str, str]) -> tuple[list[dict], Path, set[str]]:
    timeline = tmp_path / "timeline.json"
    proc = horovodrun(2, ["tests/ranks/counters.py"], "gloo", env={"HOROVOD_TIMELINE": str(timeline), **env})
    assert proc.returncode == 0, show(proc)
    ranks = rank_counters(proc.stdout)
    assert [r["rank"] for r in ranks] == [0, 1], show(proc)
    return ranks, timeline, {f"allreduce.{name}" for name in ranks[0]["names"]}


def test_bytes_per_step_and_one_fused_allreduce_per_step(tmp_path):
    # A long cycle gives the whole backward pass (well under 1 ms here) to one negotiation cycle.
    ranks, timeline, gradients = run_counters(tmp_path, {"HOROVOD_CYCLE_TIME": "300"})
    for r in ranks:
        assert r["steps"] == 3 and r["size"] == 2
        assert r["fp32_bytes"] == 4 * r["params"] * r["steps"], r
        assert r["fp16_bytes"] == 2 * r["params"] * r["fp16_steps"], r
        assert r["fp32_calls"] == r["tensors"] * r["steps"], r
        assert r["fp16_calls"] == r["tensors"] * r["fp16_steps"], r
        # One name per parameter: nothing else (metrics, stop flags) rides on the gradient path.
        assert r["names"] == sorted(["1.weight", "1.bias", "3.weight", "3.bias", "5.weight", "5.bias"]), r
    tensors, steps = ranks[0]["tensors"], ranks[0]["steps"] + ranks[0]["fp16_steps"]
    # Default fusion threshold (64 MB) holds all gradients: one operation of every tensor, each step,
    # every tensor copied through the fusion buffer.
    operations = fused_operations(timeline, gradients)
    assert operations == [tensors] * steps, operations
    # The Trainer's non-finite-loss flag joins the same operation (last, submitted after backward):
    # the check costs no negotiation of its own. The hand-written fp16 steps send no flag.
    with_flag = fused_operations(timeline, gradients | {"allreduce.step_loss"})
    assert with_flag == [tensors + 1] * ranks[0]["steps"] + [tensors] * ranks[0]["fp16_steps"], with_flag
    assert count_events(timeline, gradients, "MEMCPY_IN_FUSION_BUFFER") == tensors * steps


def test_fusion_off_gives_one_allreduce_per_tensor(tmp_path):
    ranks, timeline, gradients = run_counters(tmp_path, {"HOROVOD_FUSION_THRESHOLD": "0",
                                                         "HOROVOD_CYCLE_TIME": "300"})
    r = ranks[0]
    assert r["fp32_bytes"] == 4 * r["params"] * r["steps"], r
    # Every tensor is its own operation: allreduced once per step, never through the fusion buffer.
    # (Operations are not counted from bursts here: two one-tensor operations can log back to back.)
    assert count_events(timeline, gradients, "ALLREDUCE") == r["tensors"] * (r["steps"] + r["fp16_steps"])
    assert count_events(timeline, gradients, "MEMCPY_IN_FUSION_BUFFER") == 0
