"""Tier 3: a plain loop with hvdtrain.prepare on 2 real workers equals one worker with twice the batch (to 1e-5,
float64; lr_scaling="none", since averaged gradients of 2 x b are the gradient of 2b at the same LR), and a new job
that hvdtrain.load-s a checkpoint saved mid-epoch by hvdtrain.save ends at the same weights (two jobs a backend)."""
from __future__ import annotations

from support.processes import BACKENDS, horovodrun, show

SCRIPT = "tests/ranks/own_loop.py"


@BACKENDS
def test_prepare_on_two_workers_equals_one_with_twice_the_batch_and_resumes_mid_epoch(tmp_path, backend):
    ckpt = tmp_path / "ckpt" / "own.pt"
    trained = horovodrun(2, [SCRIPT, "train", str(ckpt)], backend, timeout=120)
    assert trained.returncode == 0 and ckpt.is_file(), show(trained)
    assert trained.stdout.count("own_loop OK") == 2, show(trained)
    # saved in epoch 1 after 3 steps of 4 samples on each of 2 workers
    assert trained.stdout.count("own_loop saved at {'epoch': 1, 'position': 24}") == 2, show(trained)
    resumed = horovodrun(2, [SCRIPT, "resume", str(ckpt)], backend, timeout=120)
    assert resumed.returncode == 0, show(resumed)
    assert resumed.stdout.count("own_loop OK") == 2, show(resumed)
