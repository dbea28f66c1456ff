"""Tier 3: --max-grad-norm on 2 real workers clips the AVERAGED gradients by their global norm, so 2 workers
clip exactly as 1 worker with twice the batch: per-tensor allreduces, buckets (which then step once, after the
last bucket) and --accumulate 2, under Gloo and MPI. Clipping each rank's own gradients before the average
would give other weights (the trap these runs catch); the pre-clip norm is logged as grad_norm."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.paths import ROOT
from support.processes import BACKENDS, horovodrun, show
from support.runs import EQUIV, records

CLIP = ["--max-grad-norm", "0.1"]   # the MLP's gradient norm is ~0.37 here: every step is clipped
# name: (batch size per worker, extra flags); each takes 32 samples per step in all, as the 1-worker reference
SETTINGS = {"buckets": (16, []), "per-tensor": (16, ["--bucket-mb", "0"]),
            "accumulate": (8, ["--accumulate", "2"])}


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "model.pt", weights_only=True)


def grad_norms(run: Path) -> list[float]:
    return [r["grad_norm"] for r in records(run, "train")]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def clipped_one_worker(tmp_path_factory) -> Path:
    """The clipped reference, one process with the global batch (32): the same for both backends, trained once.
    Tests only read its folder."""
    run_dir = tmp_path_factory.mktemp("clip-one")
    one = subprocess.run([sys.executable, "-m", "hvdtrain", *EQUIV, *CLIP, "--batch-size", "32",
                          "--run-dir", str(run_dir), "--name", "one"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert one.returncode == 0, show(one)
    return run_dir / "one"


@BACKENDS
def test_two_workers_clip_as_one_worker_with_twice_the_batch(tmp_path, backend, equiv_reference, clipped_one_worker):
    reference, unclipped = weights(clipped_one_worker), weights(equiv_reference)
    assert max_diff(reference, unclipped) > 1e-3        # the clipping changed the weights
    norms = grad_norms(clipped_one_worker)
    assert len(norms) == 3 and min(norms) > 0.2, norms   # logged per interval (12 steps, every 4), before clipping
    settings = SETTINGS if backend == "gloo" else {k: SETTINGS[k] for k in ("buckets", "accumulate")}  # MPI: per tensor
    for name, (batch, extra) in settings.items():
        proc = horovodrun(2, ["-m", "hvdtrain", *EQUIV, *CLIP, *extra, "--batch-size", str(batch),
                              "--run-dir", str(tmp_path), "--name", name, "--tensorboard", "false"], backend)
        assert proc.returncode == 0, show(proc)
        two = weights(tmp_path / name)
        for key in reference:
            torch.testing.assert_close(two[key], reference[key], atol=1e-5, rtol=0, msg=f"{name} {key}")
        assert max_diff(two, unclipped) > 1e-3, name
        torch.testing.assert_close(grad_norms(tmp_path / name), norms, atol=1e-5, rtol=0, msg=name)
