"""Tier 3: what users already have, under horovodrun: their DataLoader with a padding collate_fn and loader
workers, a Hugging Face model that computes its own loss, HF datasets streams and webdataset shards."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path

import pytest
import torch
from support.paths import ROOT
from support.processes import horovodrun, show

SCRIPT = "tests/ranks/user_loaders.py"
sys.path.insert(0, str(ROOT / "tests" / "plugins"))
from sequences import split  # noqa: E402


def run(np: int, mode: str, out: Path, *extra: str, backend: str = "gloo", env: dict | None = None) -> dict:
    args = [SCRIPT, mode, str(out), *extra]
    if np == 1:
        proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env={**__import__("os").environ, **(env or {})})
    else:
        proc = horovodrun(np, args, backend, env=env)
    assert proc.returncode == 0, show(proc)
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def gloo_job(tmp_path_factory) -> Path:
    """One Gloo job on 2 workers runs the 2-worker runs of the tests below one after another (tests/ranks/
    in_one_job.py), each into its own folder (OUT, SEQ_LOG): starting a job costs more than most of these runs.
    Each test reads its folder: OUT is r.json, the samples seen are in log/. The runs that need a job of their own
    (MPI; webdataset without the exported rank, which is set when a worker starts) launch alone.
    The equivalence run comes first, as it did when it ran alone; it logs no samples."""
    root = tmp_path_factory.mktemp("user-loaders")
    runs = {"two": ("loader", "16", "20"), "loader": ("loader", "16"), "bert": ("bert", "16"),
            "hf_stream": ("hf_stream", "25"), "wds": ("wds", "20")}
    shards = root / "wds" / "shards"
    shards.mkdir(parents=True)
    samples = write_shards(shards)
    args: list[str] = []
    for name, (mode, *extra) in runs.items():
        (root / name / "log").mkdir(parents=True, exist_ok=True)
        env = [] if name == "two" else [f"SEQ_LOG={root / name / 'log'}"]
        if name == "wds":
            env += [f"WDS_SHARDS={shards}", f"WDS_SAMPLES={samples}"]
        args += [*(["--"] if args else []), *env, SCRIPT, mode, str(root / name / "r.json"), *extra]
    proc = horovodrun(2, ["tests/ranks/in_one_job.py", *args], "gloo", timeout=900)   # several runs
    assert proc.returncode == 0, show(proc)
    return root


def seen(folder: Path) -> list[dict]:
    return [json.loads(line) for file in sorted(folder.glob("seen.*.jsonl")) for line in file.read_text().splitlines()]


def per_epoch(records: list[dict], steps_per_epoch: int) -> list[Counter]:
    """Sample counts per epoch over both ranks (each rank's records in step order)."""
    epochs: list[Counter] = []
    for rank in sorted({r["rank"] for r in records}):
        mine = [r for r in records if r["rank"] == rank]
        for step, record in enumerate(mine):
            while len(epochs) <= step // steps_per_epoch:
                epochs.append(Counter())
            epochs[step // steps_per_epoch].update(record["idx"])
    return epochs


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_their_dataloader_with_padding_and_workers_trains_every_sample_once(tmp_path, backend, request):
    if backend == "gloo":
        log = request.getfixturevalue("gloo_job") / "loader" / "log"
        report = json.loads((log.parent / "r.json").read_text())
    else:
        log = tmp_path / "log"
        log.mkdir()
        report = run(2, "loader", tmp_path / "r.json", "16", backend=backend, env={"SEQ_LOG": str(log)})
    records = seen(log)
    assert {r["rank"] for r in records} == {0, 1}
    steps = [sum(r["rank"] == rank for r in records) for rank in (0, 1)]
    assert steps[0] == steps[1] == report["rank_steps"][0] == 2 * 45       # 1437 samples: 719 a rank, 45 steps
    train_ids = {item["idx"] for item in split()[0].items}
    for counts in per_epoch(records, 45):
        # 1437 over 2 ranks: one sample padded in (DistributedSampler's rule), every other exactly once
        assert set(counts) == train_ids and sum(counts.values()) == 1438
        assert sorted(counts.values())[-2] == 1
    assert len(set(report["digests"])) == 1


def test_passing_the_loader_keeps_np2_equal_to_np1_with_twice_the_batch(tmp_path, gloo_job):
    one = run(1, "loader", tmp_path / "one.json", "32", "20")
    two = json.loads((gloo_job / "two" / "r.json").read_text())
    a, b = torch.load(tmp_path / "one.pt"), torch.load(gloo_job / "two" / "r.pt")
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-4)
    assert one["rank_steps"] == [20] and two["rank_steps"] == [20, 20]


def test_a_tiny_bert_trains_without_step_fn_and_its_hf_folder_reloads(gloo_job):
    report = json.loads((gloo_job / "bert" / "r.json").read_text())
    last = report["history"][-1]
    # A threshold: a Hugging Face model computing its own loss has no cheap reference run; that it learns is the claim.
    assert last["val_acc"] > 0.2, report["history"]          # chance is 0.1 (ten classes)
    assert report["hf_max_diff"] < 1e-5
    run_dir = gloo_job / "bert" / "runs" / "bert"
    assert (run_dir / "model.safetensors").is_file() and (run_dir / "hf" / "config.json").is_file()


def test_a_hugging_face_stream_of_10_shards_trains_each_sample_once(gloo_job):
    report = json.loads((gloo_job / "hf_stream" / "r.json").read_text())
    records = seen(gloo_job / "hf_stream" / "log")
    assert report["rank_steps"] == [40, 40]                       # 500 rows a rank, batch 25, 2 epochs
    expected = {item["idx"] for item in split()[0].items[:1000]}
    for counts in per_epoch(records, 20):
        assert set(counts) == expected and set(counts.values()) == {1}


def write_shards(folder: Path, shards: int = 4, per_shard: int = 100) -> int:
    items = split()[0].items
    for shard in range(shards):
        with tarfile.open(folder / f"shard-{shard:03d}.tar", "w") as tar:
            for i in range(shard * per_shard, (shard + 1) * per_shard):
                data = json.dumps(items[i]).encode()
                info = tarfile.TarInfo(f"{i:06d}.json")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return shards * per_shard


@pytest.mark.parametrize("export", [True, False])
def test_webdataset_shards_split_by_node_only_with_the_exported_rank(tmp_path, export, request):
    if export:   # the default: a run of the shared job
        log = request.getfixturevalue("gloo_job") / "wds" / "log"
        report, samples = json.loads((log.parent / "r.json").read_text()), 4 * 100   # write_shards' defaults
    else:
        shards, log = tmp_path / "shards", tmp_path / "log"
        shards.mkdir()
        log.mkdir()
        samples = write_shards(shards)
        env = {"SEQ_LOG": str(log), "WDS_SHARDS": str(shards), "WDS_SAMPLES": str(samples),
               "HVDTRAIN_EXPORT_RANK_ENV": "0"}
        report = run(2, "wds", tmp_path / "r.json", "20", env=env)
    assert report["rank_steps"] == [20, 20]                       # 200 a rank, batch 20, 2 epochs
    counts = per_epoch(seen(log), 10)
    if export:      # each rank reads its 2 shards: every sample once per epoch
        assert all(len(c) == samples and set(c.values()) == {1} for c in counts)
    else:           # without RANK/WORLD_SIZE webdataset gives every rank every shard: duplicates
        assert all(max(c.values()) == 2 for c in counts)
