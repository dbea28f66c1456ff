"""Rank-side: user-shaped models through the Trainer on every rank; rank 0 writes a JSON report.

    python tests/ranks/user_models.py dict|tuple BATCH OUT.json [MAX_STEPS]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch.utils.data import Subset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from plugins.user_models import TinyEncoder, TwoHeads, dict_digits, dict_step, two_heads_loss  # noqa: E402

import hvdtrain  # noqa: E402
from hvdtrain.data.datasets import digits  # noqa: E402
from hvdtrain.distributed import runtime  # noqa: E402

mode, batch, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
max_steps = int(sys.argv[4]) if len(sys.argv) > 4 else 0
# Adam for the transformer-style model; SGD for the equivalence runs (max_steps): Adam's per-element
# normalisation turns float rounding in near-zero gradients into visible weight differences.
adam = mode == "dict" and not max_steps
config = hvdtrain.load_config(epochs=6, batch_size=batch, lr=0.01 if adam else 0.05, lr_scaling="none",
                              warmup_epochs=0, max_steps=max_steps, threads=1, run_dir="",
                              optimizer="adam" if adam else "sgd",
                              metrics="acc,top5_acc" if mode == "tuple" else "auto")
torch.manual_seed(config.seed)
if mode == "dict":
    train, val, _ = dict_digits(config)
    trainer = hvdtrain.Trainer(TinyEncoder(), train, val, step_fn=dict_step, config=config)
else:
    data = digits(config)
    train, val = data.train, data.val
    trainer = hvdtrain.Trainer(TwoHeads(), train, val, loss_fn=two_heads_loss, config=config)
# Before training (the seeded weights, the same in every configuration); unequal shards on purpose:
# 101 samples over 2 ranks is 51 + 50.
odd = trainer.evaluate(Subset(val, range(101)))
history = trainer.fit()
world = runtime.world()
if world.is_root:
    out.write_text(json.dumps({"history": list(history), "odd": odd, "size": world.size,
                               "digests": history.summary["param_digests"]}))
    torch.save(trainer.model.state_dict(), out.with_suffix(".pt"))
