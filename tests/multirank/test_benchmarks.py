"""The benchmark harness runs end to end at its smoke size: well-formed outputs, no timings asserted."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, show

from benchmarks.run import launch, parse_args, ratios, variants


def test_variants_alternate_and_cover_the_issue():
    two = [v["name"] for v in variants(2, ["gloo", "mpi"])]
    assert {"ddp", "compute", "hvdtrain-gloo", "horovod-gloo", "allreduce-gloo", "hvdtrain-mpi"} <= set(two)
    assert [v["name"] for v in variants(1, ["gloo"])] == ["single", "hvdtrain", "horovod", "ddp"]
    smoke = parse_args(["--smoke"])
    assert smoke.models == "mlp" and smoke.steps < 10


def test_ratios_are_speed_ratios():
    groups = {"mlp/np1": {"hvdtrain": {"best_ms": 10.0}, "horovod": {"best_ms": 9.0}},
              "mlp/np2": {"hvdtrain-gloo": {"best_ms": 20.0}, "ddp": {"best_ms": 25.0},
                          "compute": {"best_ms": 12.0}, "allreduce-gloo": {"best_ms": 16.0}}}
    r = ratios(groups, ["gloo"])["mlp"]
    assert r["hvdtrain_vs_horovod_np1"] == pytest.approx(0.9)
    assert r["hvdtrain_vs_ddp_np2_gloo"] == pytest.approx(1.25)
    assert r["step_over_max_compute_comm_gloo"] == pytest.approx(20 / 16)
    assert r["scaling_efficiency_hvdtrain_gloo"] == pytest.approx(0.5)


def test_a_failed_launch_is_retried_once_and_both_failures_are_reported(capsys):
    record = launch({"variant": "no-such-variant", "launcher": "python"}, 1, ["--steps", "1", "--smoke"], {}, 120)
    assert record["error"] == "exit 1"
    assert "unknown variant no-such-variant" in record["retried_after"]
    assert "unknown variant no-such-variant" in record["output_tail"]
    err = capsys.readouterr().err
    assert "retrying once" in err and "failed again" in err


def test_smoke_run_end_to_end(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--smoke", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, show(proc)
    result = json.loads((tmp_path / "results.json").read_text())
    assert set(result) == {"meta", "groups", "ratios", "bandwidth"}
    assert set(result["groups"]) == {"mlp/np1", "mlp/np2"}
    for group, rows in result["groups"].items():
        for row in rows.values():
            assert row["failed"] == 0 and row["best_ms"] > 0 and row["median_ms"] >= row["best_ms"], (group, row)
            assert row["np"] == int(group[-1]), row
            assert row["grad_bytes"] == 4 * row["params"]
    assert result["groups"]["mlp/np1"]["hvdtrain"]["runs"] == 2  # alternated: A B .. B A
    assert {"hvdtrain_vs_horovod_np1", "hvdtrain_vs_ddp_np2_gloo",
            "step_over_max_compute_comm_gloo"} <= set(result["ratios"]["mlp"])
    for impl in ("horovod-gloo", "torch-gloo", "memcpy"):
        rows = result["bandwidth"][impl]
        assert [r["size_mb"] for r in rows] == [0.25, 1.0] and all(r["busbw_gbs"] > 0 for r in rows), impl
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "hvdtrain-gloo" in (tmp_path / "results.md").read_text()
    assert "ratios" in proc.stdout


def test_ab_settings_parse_and_refuse_bad_ones():
    from benchmarks.ab import parse_setting

    assert parse_setting("default:") == ("default", {})
    assert parse_setting("c5:HOROVOD_CYCLE_TIME=5,HOROVOD_THREAD_AFFINITY=UNSET") == (
        "c5", {"HOROVOD_CYCLE_TIME": "5", "HOROVOD_THREAD_AFFINITY": "UNSET"})
    assert parse_setting("p:HOROVOD_THREAD_AFFINITY=0,1,B=2") == ("p", {"HOROVOD_THREAD_AFFINITY": "0,1", "B": "2"})
    for bad in ("nocolon", ":A=1", "x:A"):
        with pytest.raises(SystemExit, match="benchmarks.ab"):
            parse_setting(bad)


def test_ab_alternates_settings_end_to_end():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.ab", "--smoke", "--reps", "2", "--steps", "6",
                           "plain:", "cycle5:HOROVOD_CYCLE_TIME=5,HOROVOD_THREAD_AFFINITY=UNSET"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, show(proc)
    order = [line.split()[2] for line in proc.stdout.splitlines() if line.startswith("rep ")]
    assert order == ["plain", "cycle5", "cycle5", "plain"], proc.stdout  # A B, then B A
    summaries = [line for line in proc.stdout.splitlines() if line.startswith("SUMMARY")]
    assert len(summaries) == 2 and all("(2 runs)" in line for line in summaries), proc.stdout
