"""Benchmark (not a test): training throughput vs `--workers` when every sample costs real CPU time.

The dataset decodes-and-augments each sample on the fly: a random crop, a flip and a blur done in numpy
on a 96x96 image, then a downsample to 1x16x16 — a few milliseconds per sample, like JPEG decoding and
torchvision transforms. With `--workers 0` the training process does this between steps; with N loader
workers it overlaps with training.

    PYTHONPATH=benchmarks python benchmarks/loader_workers.py [--workers 0,1,2,4] [--samples 1536]

It runs `python -m hvdtrain --dataset loader_workers:costly --workers N ...` once per N (one Horovod
worker, so the figures are about loading, not allreduce) and prints samples/s from summary.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.data.datasets import Data

SIZE = 96


class Costly(Dataset):
    """Labels from a fixed seed; pixels recomputed (randomly augmented) on every access."""

    def __init__(self, n: int, seed: int) -> None:
        self.labels = np.random.default_rng(seed).integers(0, 10, n)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        info = get_worker_info()
        rng = np.random.default_rng(torch.initial_seed() if info else None)  # per-worker stream (hvdtrain seeds it)
        label = int(self.labels[index])
        y, x = np.mgrid[0:SIZE + 16, 0:SIZE + 16] / SIZE
        image = np.sin((label + 1) * 3 * x) * np.cos((index % 7 + 1) * y) + rng.normal(0, 0.3, x.shape)
        top, left = rng.integers(0, 16, 2)
        image = image[top:top + SIZE, left:left + SIZE]                 # random crop
        if rng.random() < 0.5:
            image = image[:, ::-1]                                       # random flip
        for _ in range(6):                                               # 3x3 box blur, six passes
            image = sum(np.roll(np.roll(image, dy, 0), dx, 1) for dy in (-1, 0, 1) for dx in (-1, 0, 1)) / 9
        small = image.reshape(16, SIZE // 16, 16, SIZE // 16).mean(axis=(1, 3))
        return torch.tensor(small, dtype=torch.float32).unsqueeze(0), label


def costly(config: TrainConfig) -> Data:
    """hvdtrain dataset plug-in: `--dataset loader_workers:costly` (size from --synthetic-samples)."""
    return Data(Costly(config.synthetic_samples, config.seed), Costly(64, config.seed + 1), 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="0,1,2,4")
    parser.add_argument("--samples", type=int, default=1536)
    parser.add_argument("--epochs", type=int, default=2)
    opts = parser.parse_args()
    start = time.perf_counter()
    Costly(64, 0)[0]
    per_sample_ms = (time.perf_counter() - start) * 1000
    print(f"cores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}, "
          f"~{per_sample_ms:.1f} ms of CPU per sample in this process", flush=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    # samples/s: the whole run (process start, loader start-up, evaluation included); last epoch: training only.
    print(f"{'workers':>7} {'samples/s':>10} {'last epoch s':>12} {'last epoch samples/s':>20} {'wall s':>7}")
    with tempfile.TemporaryDirectory() as runs:
        for workers in (int(w) for w in opts.workers.split(",")):
            name = f"w{workers}"
            args = [sys.executable, "-m", "hvdtrain", "--dataset", "loader_workers:costly", "--model", "mlp",
                    "--hidden", "64", "--synthetic-samples", str(opts.samples), "--epochs", str(opts.epochs),
                    "--batch-size", "32", "--workers", str(workers), "--threads", "1",
                    "--run-dir", runs, "--name", name]
            began = time.perf_counter()
            subprocess.run(args, env=env, check=True, capture_output=True, text=True)
            wall = time.perf_counter() - began
            summary = json.loads((Path(runs) / name / "summary.json").read_text())
            epoch_s = summary["epoch_time_s"]
            print(f"{workers:>7} {summary['samples_per_s']:>10.0f} {epoch_s:>12.2f} {opts.samples / epoch_s:>20.0f} "
                  f"{wall:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
