"""Tier 3: hybrid parallel, 2 Horovod workers x 2 pipeline stages each, against one plain process."""
from __future__ import annotations

import json

import torch
from support.processes import BACKENDS, horovodrun, show
from support.runs import EQUIV


@BACKENDS
def test_two_workers_by_two_stages_equal_one_process_with_the_global_batch(tmp_path, backend, equiv_reference):
    # Each worker: the MLP in 2 stages, 4 micro-batches of its 16 samples, loaded by 2 worker processes.
    proc = horovodrun(2, ["-m", "hvdtrain", *EQUIV, "--batch-size", "16", "--stages", "2", "--micro-batches", "4",
                          "--workers", "2", "--run-dir", str(tmp_path), "--name", "hybrid"], backend)
    assert proc.returncode == 0, show(proc)
    one = torch.load(equiv_reference / "model.pt", weights_only=True)
    hybrid = torch.load(tmp_path / "hybrid" / "model.pt", weights_only=True)
    assert one.keys() == hybrid.keys()  # a pipelined run saves the unsplit model's parameter names
    for key in one:
        torch.testing.assert_close(hybrid[key], one[key], atol=1e-5, rtol=0)
    summary = json.loads((tmp_path / "hybrid" / "summary.json").read_text())
    assert summary["rank_steps"] == [12, 12] and len(set(summary["param_digests"])) == 1
