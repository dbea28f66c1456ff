"""Rank-side: count the gradient traffic of real training steps (fp32 via the Trainer, fp16 by hand).

Prints one COUNTERS line of JSON per rank; tests/test_counters.py asserts on it and on the timeline.
"""
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # tests/: the instrumentation

from support.allreduce_count import count_gradient_allreduces  # noqa: E402

import hvdtrain  # noqa: E402
from hvdtrain.data.datasets import build_data  # noqa: E402
from hvdtrain.distributed import collectives, runtime  # noqa: E402
from hvdtrain.models.builtin import build_model  # noqa: E402

STEPS = 3
ARGS = ["--dataset", "synthetic", "--synthetic-samples", "512", "--synthetic-shape", "1,8,8", "--model", "mlp",
        "--hidden", "32", "--batch-size", "16", "--max-steps", str(STEPS), "--log-interval", "1000",
        "--threads", "1", "--run-dir", "", "--bucket-mb", "0"]  # per-tensor: counted and named one by one

config = hvdtrain.load_config(None, ARGS + sys.argv[1:])
torch.manual_seed(config.seed)
data = build_data(config)
model = build_model(config, tuple(data.train[0][0].shape), data.num_classes)
params = sum(p.numel() for p in model.parameters())
tensors = sum(1 for _ in model.parameters())

# hvdtrain's own loop, fp32 gradients.
trainer = hvdtrain.Trainer(model, data.train, data.val, config=config)
with count_gradient_allreduces() as fp32:
    trainer.fit()
steps = trainer.progress.step

# fp16 compression. hvdtrain has no --compression yet (another branch adds it); until then this goes to
# Horovod directly, the same wrapper with compression=fp16.
import horovod.torch as hvd  # noqa: E402

model = build_model(config, tuple(data.train[0][0].shape), data.num_classes)  # fresh: no Trainer hooks
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters(),
                                     compression=hvd.Compression.fp16)
inputs, targets = data.train[:config.batch_size]
with count_gradient_allreduces() as fp16:
    for _ in range(STEPS):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()

# The timeline is written by a background thread: one more collective and a pause let it catch up
# before shutdown, so the last step's events are in the file.
collectives.allreduce_sum(torch.zeros(1), name="flush")
time.sleep(2)
world = runtime.world()
print("COUNTERS " + json.dumps({
    "rank": world.rank, "size": world.size, "params": params, "tensors": tensors, "steps": steps,
    "fp32_calls": fp32.calls, "fp32_bytes": fp32.bytes, "fp16_steps": STEPS, "fp16_calls": fp16.calls,
    "fp16_bytes": fp16.bytes, "names": sorted(set(fp32.names))}), flush=True)
runtime.shutdown()  # flushes the timeline, when one was asked for
