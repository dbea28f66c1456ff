"""The benchmark harness runs end to end at its smoke size: well-formed outputs, no timings asserted."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest
from support.paths import ROOT
from support.processes import show

from benchmarks.run import LATEST, latest_run, launch, parse_args, ratios, run_job, update_latest, variants


def test_variants_alternate_and_cover_the_issue():
    two = [v["name"] for v in variants(2, ["gloo", "mpi"])]
    assert {"ddp", "compute", "hvdtrain-gloo", "horovod-gloo", "allreduce-gloo", "hvdtrain-mpi"} <= set(two)
    assert [v["name"] for v in variants(1, ["gloo"])] == ["single", "hvdtrain", "horovod", "ddp"]
    assert [v["name"] for v in variants(2, ["gloo"], light=True)] == ["ddp", "hvdtrain-gloo", "horovod-gloo"]
    assert parse_args([]).models == "mlp,cnn,resnet18,transformer"
    smoke = parse_args(["--smoke"])
    assert smoke.models == "mlp,resnet18,transformer" and smoke.steps < 10


def fake_result(smoke: bool = False, failed: int = 0) -> dict:
    return {"meta": {"smoke": smoke}, "groups": {"mlp/np1": {"hvdtrain": {"failed": failed}}}}


def test_latest_points_at_the_newest_full_run_only(tmp_path):
    root = tmp_path / "results"
    for name in ("2026-12-03-a", "2026-12-04-b", "smoke", "broken"):
        (root / name).mkdir(parents=True)
        (root / name / "results.json").write_text("{}")
    assert latest_run(root) is None                                      # no pointer yet
    assert update_latest(root / "2026-12-03-a", fake_result(), root)
    assert latest_run(root) == root / "2026-12-03-a"
    assert (root / LATEST).read_text() == "2026-12-03-a\n"             # a text file: the folder name
    assert not update_latest(root / "smoke", fake_result(smoke=True), root)      # smoke runs never
    assert not update_latest(root / "broken", fake_result(failed=1), root)       # nor runs with failures
    assert not update_latest(tmp_path / "elsewhere", fake_result(), root)        # nor folders outside
    assert latest_run(root) == root / "2026-12-03-a"
    assert update_latest(root / "2026-12-04-b", fake_result(), root)    # a newer full run takes over
    assert latest_run(root) == root / "2026-12-04-b"
    assert not list(root.glob(f".{LATEST}*"))                           # written atomically, no temp left
    (root / "2026-12-04-b" / "results.json").unlink()                   # pointer to a folder without results
    assert latest_run(root) is None
    for bad in ("", "../x", "/etc"):
        (root / LATEST).write_text(bad)
        assert latest_run(root) is None, bad


def test_the_repository_pointer_names_a_run_with_ratios():
    from benchmarks.run import RESULTS

    folder = latest_run(RESULTS)
    if (RESULTS / LATEST).exists():
        assert folder is not None, "benchmarks/results/latest names no folder with results.json"
        result = json.loads((folder / "results.json").read_text())
        assert result["ratios"] and not result["meta"]["smoke"]


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


def test_one_model_run_end_to_end(tmp_path):
    """The default run's short form of the smoke run below (--smoke --models mlp): every variant and launcher of
    the tiny MLP at np 1 and 2, the bandwidth sweep, the ratios and the three output files; the real-size models'
    code paths are the long form's (and test_overhead's transformer). One round (--rounds 1): each variant once, 4
    launches fewer; the A B .. B A alternation of a second round is the long form's check."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--smoke", "--models", "mlp", "--rounds", "1",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, show(proc)
    result = json.loads((tmp_path / "results.json").read_text())
    assert set(result["groups"]) == {"mlp/np1", "mlp/np2"}
    assert set(result["groups"]["mlp/np1"]) == {"single", "hvdtrain", "horovod", "ddp"}
    assert {"ddp", "compute", "hvdtrain-gloo", "horovod-gloo", "allreduce-gloo"} == set(result["groups"]["mlp/np2"])
    for group, rows in result["groups"].items():
        for row in rows.values():
            assert row["failed"] == 0 and row["best_ms"] > 0 and row["median_ms"] >= row["best_ms"], (group, row)
            assert row["np"] == int(group[-1]), row
    assert {"hvdtrain_vs_horovod_np1", "hvdtrain_vs_ddp_np2_gloo", "step_over_max_compute_comm_gloo",
            "scaling_efficiency_hvdtrain_gloo"} <= set(result["ratios"]["mlp"])
    for impl in ("horovod-gloo", "torch-gloo", "memcpy"):
        rows = result["bandwidth"][impl]
        assert [r["size_mb"] for r in rows] == [0.25, 1.0] and all(r["busbw_gbs"] > 0 for r in rows), impl
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "hvdtrain-gloo" in (tmp_path / "results.md").read_text()


@pytest.mark.long
def test_smoke_run_end_to_end(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--smoke", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, show(proc)
    result = json.loads((tmp_path / "results.json").read_text())
    assert set(result) == {"meta", "groups", "ratios", "bandwidth"}
    assert set(result["groups"]) == {f"{m}/np{n}" for m in ("mlp", "resnet18", "transformer") for n in (1, 2)}
    for group, rows in result["groups"].items():
        for row in rows.values():
            assert row["failed"] == 0 and row["best_ms"] > 0 and row["median_ms"] >= row["best_ms"], (group, row)
            assert row["np"] == int(group[-1]), row
            assert row["grad_bytes"] == 4 * row["params"]
    assert result["groups"]["mlp/np1"]["hvdtrain"]["runs"] == 2  # alternated: A B .. B A
    assert result["groups"]["resnet18/np1"]["hvdtrain"]["runs"] == 1  # the light models: one round
    assert {"hvdtrain_vs_horovod_np1", "hvdtrain_vs_ddp_np2_gloo",
            "step_over_max_compute_comm_gloo"} <= set(result["ratios"]["mlp"])
    for model in ("resnet18", "transformer"):  # the real-size workloads, light variant sets
        assert {"hvdtrain_vs_ddp_np2_gloo", "hvdtrain_vs_horovod_np2_gloo",
                "scaling_efficiency_hvdtrain_gloo"} <= set(result["ratios"][model]), model
    assert result["groups"]["transformer/np2"]["hvdtrain-gloo"]["params"] > 0
    assert not (tmp_path.parent / LATEST).exists()  # a smoke run never moves the latest pointer
    row = result["groups"]["mlp/np2"]["hvdtrain-gloo"]
    # The comm threads' CPU is read from /proc in 10 ms ticks, and a smoke step (~2.5 ms) may register none: only
    # that it is recorded is checked. The process CPU per step comes from a ns clock and must be positive.
    assert math.isfinite(row["comm_thread_cpu_ms"]) and row["median_cpu_ms"] > 0
    for impl in ("horovod-gloo", "torch-gloo", "memcpy"):
        rows = result["bandwidth"][impl]
        assert [r["size_mb"] for r in rows] == [0.25, 1.0] and all(r["busbw_gbs"] > 0 for r in rows), impl
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "hvdtrain-gloo" in (tmp_path / "results.md").read_text()
    assert "ratios" in proc.stdout


def test_ddp_gloo_threads_knob_sets_the_groups_thread_count():
    probe = ("import torch, torch.distributed as d\nfrom benchmarks.worker import gloo_threads\n"
             "gloo_threads(1)\nd.init_process_group('gloo', store=d.HashStore(), rank=0, world_size=1)\n"
             "t = torch.ones(2)\nd.all_reduce(t)\n"
             "print(d.group.WORLD._get_backend(torch.device('cpu')).options._threads, t.tolist())")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, show(proc)
    assert proc.stdout.split() == ["1", "[1.0,", "1.0]"]   # torch's default is 2


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


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_overhead_alternates_both_loops_in_one_process(tmp_path, model):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.overhead", "--smoke", "--model", model, "--rounds", "2",
                           "--steps", "5", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, show(proc)
    summary = json.loads((tmp_path / f"overhead_{model}.json").read_text())
    assert [sorted(r) for r in summary["rounds"]] == [["hand", "hvdtrain"]] * 2
    assert summary["hvdtrain_ms"] > 0 and summary["hand_ms"] > 0
    assert summary["ratio_hand_over_hvdtrain"] == pytest.approx(summary["hand_ms"] / summary["hvdtrain_ms"])
    assert "SUMMARY" in proc.stdout


def test_a_job_that_times_out_is_ended_with_its_whole_process_tree(tmp_path):
    """The grandchild sits in a session of its own (as mpirun does under horovodrun): it must end too."""
    marker = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time\n"
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
              f"open({str(marker)!r}, 'w').write(str(p.pid))\n"
              "time.sleep(60)")
    out, code = run_job([sys.executable, "-c", script], dict(os.environ), timeout=3)
    assert code == -1 and out.endswith("timed out after 3s")
    grandchild = int(marker.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{grandchild}") and open(f"/proc/{grandchild}/stat").read().split()[2] != "Z":
        if time.monotonic() > deadline:
            os.kill(grandchild, 9)
            raise AssertionError("the grandchild survived the timeout")
        time.sleep(0.1)
