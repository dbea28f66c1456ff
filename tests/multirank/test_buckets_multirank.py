"""Tier 3: gradients in DDP-like buckets (--bucket-mb) on 2 real workers: Horovod is handed one allreduce per
bucket instead of one per gradient with Gloo ops (MPI ops keep one per gradient), and the weights equal those of
per-tensor allreduces (fp32 and fp16 on the wire, with accumulation); the Trainer's default sends buckets (grouped
allreduces in Horovod's timeline), its gradients views of one buffer per bucket, allreduced in place."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.processes import BACKENDS, horovod_patched, horovodrun, show
from support.runs import EQUIV
from support.timeline import timeline_ops


@pytest.fixture(scope="module")
def rank_reports(tmp_path_factory):
    """The rank scripts' reports, by backend: one launch per backend runs them all (tests/ranks/in_one_job.py),
    since starting a job costs more than the scripts do. Gloo also runs unused_params.py (a Gloo-only check) first;
    bucket_step.py runs last, since it sets HVDTRAIN_STEP_BY_BUCKET."""
    found = {}

    def reports(backend: str) -> dict[str, Path]:
        if backend not in found:
            folder = tmp_path_factory.mktemp(f"buckets-{backend}")
            scripts = (["unused_params"] if backend == "gloo" else []) + ["buckets", "bucket_step"]
            args = [arg for i, name in enumerate(scripts)
                    for arg in (["--"] if i else []) + [f"tests/ranks/{name}.py", str(folder / f"{name}.pt")]]
            proc = horovodrun(2, ["tests/ranks/in_one_job.py", *args], backend, timeout=600)   # several runs
            assert proc.returncode == 0, show(proc)
            found[backend] = {name: folder / f"{name}.pt" for name in scripts}
        return found[backend]

    return reports


@BACKENDS
def test_a_bucket_is_one_allreduce_and_gives_the_weights_of_per_tensor_ones(rank_reports, backend):
    report = torch.load(rank_reports(backend)["buckets"], weights_only=False)
    found, steps = report["found"], report["steps"]
    assert report["buckets"] == {0.0: 6, 25.0: 1, 0.1: 3}   # six gradients: per tensor, one bucket, three
    assert report["backend"] == {"gloo": "Gloo", "mpi": "MPI"}[backend]
    for (bucket_mb, compression, _), run in found.items():
        submitted = report["buckets"][bucket_mb] if backend == "gloo" else 6   # MPI ops: per tensor
        assert run["submissions"] == submitted * steps, (bucket_mb, compression, run)
        # Buckets as gradient views carry the non-finite-loss flag, one float32 after the first bucket's gradients.
        flag = int(backend == "gloo" and bucket_mb > 0 and compression == "none")
        assert run["tensors"] == (6 + flag) * steps, run
    assert found[(0.1, "fp16", 2)]["bytes"] * 2 == found[(0.0, "none", 1)]["bytes"]   # fp16 halves buckets too
    assert report["digests"][0] == report["digests"][1]   # both replicas equal, in every setting
    # The same sums of the same tensors, fused or not: bit for bit.
    per_tensor = found[(0.0, "none", 1)]["weights"]
    for setting in ((25.0, "none", 1), (0.1, "none", 1)):
        torch.testing.assert_close(found[setting]["weights"], per_tensor, atol=0, rtol=0, msg=str(setting))
    for compression in ("none", "fp16"):   # accumulated over 2 backward passes (in place in the buckets' buffers)
        torch.testing.assert_close(found[(0.1, compression, 2)]["weights"], found[(0.0, compression, 2)]["weights"],
                                   atol=0, rtol=0, msg=compression)


def fusion_copies(timeline: Path) -> int:
    """Tensors copied into Horovod's fusion buffer, by the timeline's MEMCPY_IN_FUSION_BUFFER begin events."""
    return sum(1 for e in json.loads(timeline.read_text()) if e.get("ph") == "B"
               and e.get("name") == "MEMCPY_IN_FUSION_BUFFER")


def test_the_trainer_sends_buckets_in_place_by_default_with_the_weights_of_per_tensor_allreduces(tmp_path):
    runs = {"buckets": ([], {}), "per-tensor": (["--bucket-mb", "0"], {}),
            "bucket-copies": ([], {"HVDTRAIN_GRAD_VIEWS": "0"}),
            "ring": ([], {"HOROVOD_EXCHANGE_ALLREDUCE": "0"})}   # Gloo's ring, not the 2-rank exchange
    for name, (extra, env) in runs.items():
        proc = horovodrun(2, ["-m", "hvdtrain", *EQUIV, *extra, "--batch-size", "16", "--run-dir", str(tmp_path),
                              "--name", name, "--tensorboard", "false",
                              "--timeline-file", str(tmp_path / f"{name}.json")], "gloo", env=env)
        assert proc.returncode == 0, show(proc)
    assert timeline_ops(tmp_path / "buckets.json", "grouped_allreduce")
    assert not timeline_ops(tmp_path / "per-tensor.json", "grouped_allreduce")
    # Gradients as views of one buffer per bucket: hvdtrain's patched Horovod allreduces them where they lie.
    assert fusion_copies(tmp_path / "bucket-copies.json") > 0
    if horovod_patched("HOROVOD_EXCHANGE_ALLREDUCE"):   # the in-place patch came with it
        assert fusion_copies(tmp_path / "buckets.json") == 0
    weights = {name: torch.load(tmp_path / name / "model.pt", weights_only=True) for name in runs}
    for name in ("buckets", "bucket-copies", "ring"):
        a, b = weights[name], weights["per-tensor"]
        assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a), name


def test_a_layer_some_ranks_skip_neither_stalls_buckets_nor_changes_the_weights(rank_reports):
    # Before hvdtrain sent unfinished buckets itself, the rank that skipped the layer sent its parameters one by one
    # while its peer sent the bucket: Horovod stalled until the job's timeout (rank_reports: the script runs first
    # in the Gloo job and takes ~5 s of it).
    report = torch.load(rank_reports("gloo")["unused_params"], weights_only=False)
    assert report["buckets"] == {25.0: 1, 0.001: 6}   # one bucket; and each tensor a bucket of its own
    per_tensor = report["found"][0.0]
    for bucket_mb in (25.0, 0.001):
        torch.testing.assert_close(report["found"][bucket_mb], per_tensor, atol=0, rtol=0, msg=str(bucket_mb))


@BACKENDS
def test_stepping_bucket_by_bucket_gives_the_weights_of_one_step_and_skips_a_non_finite_step_on_every_rank(
        rank_reports, backend):
    report = torch.load(rank_reports(backend)["bucket_step"], weights_only=False)
    found, steps, nan_step = report["found"], report["steps"], report["nan_step"]
    assert report["digests"][0] == report["digests"][1]   # both replicas equal, in every setting
    for kind in ("sgd", "adamw"):
        by_bucket, whole = found[(kind, True)], found[(kind, False)]
        applied = steps - 1
        assert by_bucket["skipped"] == whole["skipped"] == 1, kind   # rank 1's NaN loss: skipped on rank 0 too
        assert whole["calls"] == applied, kind
        # Gloo: three buckets, each stepped on its own. MPI ops send per tensor (no buckets): one step.
        assert by_bucket["calls"] == (applied * by_bucket["buckets"] if backend == "gloo" else applied), kind
        assert by_bucket["buckets"] == (3 if backend == "gloo" else 0), kind
        for n in range(steps):
            torch.testing.assert_close(by_bucket["weights"][n], whole["weights"][n], atol=0, rtol=0,
                                       msg=f"{kind} step {n}")
        unchanged = by_bucket["weights"][nan_step - 1]
        torch.testing.assert_close(by_bucket["weights"][nan_step], unchanged, atol=0, rtol=0)
    # A trainable parameter the optimizer does not hold, first in the first bucket: the flag is sent on its own
    # and every step is one step after the last bucket; the NaN step is still skipped on both ranks.
    partial = found[("partial", True)]
    assert partial["skipped"] == 1 and partial["calls"] == steps - 1, partial["calls"]
    for n in range(steps):
        torch.testing.assert_close(partial["weights"][n], found[("partial", False)]["weights"][n], atol=0, rtol=0)
