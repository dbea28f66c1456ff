"""The network benchmark (benchmarks/network.py) end to end at its smoke size: two namespace hosts on
tbf-limited links, DDP and hvdtrain over Gloo, bytes counted on each host's interface. No timings asserted."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.netns_cluster import SSHD, rate_bits
from support.paths import ROOT
from support.processes import show

from benchmarks.netreport import ratios, ring_bound_ms
from benchmarks.network import env_variant, net_variants


def test_ring_bound_and_link_rates():
    # 2(n-1)/n * S / B: 45 MB of gradients on 2 ranks at 1 Gbit/s take at least 0.36 s
    assert ring_bound_ms(45e6, 2, 1e9) == pytest.approx(360.0)
    assert ring_bound_ms(45e6, 3, 1e9) == pytest.approx(480.0)
    assert ring_bound_ms(45e6, 1, 1e9) == 0.0
    assert rate_bits("1gbit") == 1e9 and rate_bits("500mbit") == 5e8 and rate_bits("2.5gbit") == 2.5e9
    with pytest.raises(ValueError, match="1gbit"):
        rate_bits("fast")


def test_fp16_and_bf16_wires_run_beside_fp32_and_their_bytes_are_compared():
    rows = {row["name"]: row for row in net_variants(2, ["gloo", "mpi"], smoke=False)}
    assert rows["hvdtrain-gloo-bf16"]["hvdtrain_args"] == "--compression bf16"
    assert rows["hvdtrain-gloo-fp16"]["hvdtrain_args"] == "--compression fp16"
    assert "hvdtrain-mpi-bf16" not in rows   # the first backend only
    cell = {"best_ms": 100.0, "median_ms": 110.0, "tx_bytes_per_step": 4e6, "ring_bound_ms": 32.0}
    groups = {"cnn/np2": {"hvdtrain-gloo": cell,
                          "hvdtrain-gloo-bf16": dict(cell, best_ms=50.0, median_ms=55.0, tx_bytes_per_step=2e6)}}
    found = ratios(groups, ["gloo"], 1e9)["cnn/np2"]
    assert found["bf16_speedup_gloo"] == 2.0 and found["bf16_tx_bytes_ratio_gloo"] == 0.5
    assert "fp16_speedup_gloo" not in found


def test_an_env_variant_is_hvdtrain_with_its_own_environment_or_options():
    # --variant before:HVDTRAIN_SCALE_FIRST=0 runs beside the others, alternated, on the first backend
    assert env_variant("before:HVDTRAIN_SCALE_FIRST=0,HOROVOD_CYCLE_TIME=1", "gloo") == {
        "name": "before", "variant": "hvdtrain", "launcher": "horovodrun", "backend": "gloo",
        "env": {"HVDTRAIN_SCALE_FIRST": "0", "HOROVOD_CYCLE_TIME": "1"}}
    assert env_variant("b10:ARGS=--bucket-mb 10", "mpi") == {
        "name": "b10", "variant": "hvdtrain", "launcher": "horovodrun", "backend": "mpi",
        "hvdtrain_args": "--bucket-mb 10", "env": {}}
    assert env_variant("now:", "gloo")["env"] == {}
    # NAME@ddp: DDP with that environment (BENCH_GLOO_THREADS=1: one Gloo thread, as Horovod sends)
    assert env_variant("ddp1@ddp:BENCH_GLOO_THREADS=1", "gloo") == {
        "name": "ddp1", "variant": "ddp", "launcher": "torchrun", "env": {"BENCH_GLOO_THREADS": "1"}}


def test_network_smoke_run_counts_the_bytes_each_host_sent(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: creates network namespaces, runs sshd, sets tc qdiscs (CI runs as root)")
    for tool in ("ip", "tc", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(f"no {tool} on PATH (Debian: iproute2, util-linux, openssh-client)")
    if not Path(SSHD).exists():
        pytest.skip(f"no {SSHD}: install Debian's openssh-server")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--hosts", "2", "--link", "1gbit", "--smoke",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, show(proc)
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["meta"]["link_bits"] == 1e9 and result["meta"]["network"]
    # one TCP stream through both tbfs: never above the limit (tbf's burst allows a little over)
    assert all(0 < mbit <= 1100 for mbit in result["meta"]["link_probe_mbit"]), result["meta"]
    rows = result["groups"]["mlp/np2"]
    assert set(rows) == {"ddp", "hvdtrain-gloo"}
    for name, row in rows.items():
        assert row["failed"] == 0 and row["np"] == 2, (name, row)
        # every rank's host sent at least what a ring allreduce of the gradients must send
        # (2(n-1)/n x S; more for headers and Horovod's coordination), counted on its own interface
        ring_bytes = 2 * (2 - 1) / 2 * row["grad_bytes"]
        assert len(row["tx_bytes_per_rank"]) == 2 and min(row["tx_bytes_per_rank"]) >= ring_bytes, (name, row)
        assert row["ring_bound_ms"] == pytest.approx(ring_bound_ms(row["grad_bytes"], 2, 1e9))
        assert 0 <= row["others_cpu_share"][0] <= 1 and len(row["loadavg"][0]) == 3
    assert "hvdtrain_gloo_vs_ddp" in result["ratios"]["mlp/np2"]
    assert "bound ms" in (tmp_path / "results.md").read_text()
    # the cluster is gone: no namespace of this run left behind
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert result["meta"]["namespace_prefix"] not in after
